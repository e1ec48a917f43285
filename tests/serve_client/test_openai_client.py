"""`lowbit serve` through the official `openai` Python client, over loopback.

Servers started here (each `lowbit serve` on a free port, killed at the end):
  * an any-precision stories260K file (quantized here, widths 3/4/8), served as stories, stories@3bit, ...: every
    endpoint, streaming and not, stop strings, log-probabilities, usage, errors, the API key, concurrent requests
    at mixed widths (each equal to `lowbit generate --bits` at its width), a fuzz of malformed requests, a soak with
    the server's memory measured;
  * SmolLM2-135M-Instruct (the GGUF the project's setup fetches): its chat template, and cancellation (a client that
    disconnects mid-stream, or gives up on a non-streaming request, frees its slot and KV cache).

Usage: test_openai_client.py LOWBIT_CLI STORIES260K_BIN [SMOLLM2_GGUF]
Prints the soak's memory figures (docs/SERVE.md quotes them). Exit status 0 when every check passes.
"""
import concurrent.futures
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import openai

LOWBIT, STORIES = sys.argv[1], sys.argv[2]
SMOLLM2 = sys.argv[3] if len(sys.argv) > 3 else ""
KEY = "sk-lowbit-test"
TMP = tempfile.mkdtemp(prefix="lowbit-client-")
ANYPREC = os.path.join(TMP, "stories.anyprec.lowbit")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model, *extra, name=None, key=KEY):
        self.port = free_port()
        args = [LOWBIT, "--threads", "1", "serve", model, "--port", str(self.port), "--device", "cpu", *extra]
        if key:
            args += ["--api-key", key]
        if name:
            args += ["--model-name", name]
        self.log = open(os.path.join(TMP, f"serve-{self.port}.log"), "w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"lowbit serve exited {self.proc.returncode}: {self.log.read()}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("lowbit serve did not answer /health within 60 s")
        self.client = openai.OpenAI(base_url=self.base + "/v1", api_key=key or "none", max_retries=0, timeout=120)

    def metrics(self):
        req = urllib.request.Request(self.base + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            out = {}
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, value = line.rsplit(" ", 1)
                    out[name] = float(value)
            return out

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def post_raw(self, path, body, headers=None):
        """Status and parsed JSON body of a raw POST (bodies the client library would refuse to send)."""
        h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
        req = urllib.request.Request(self.base + path, data=body, headers=h, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self):
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        self.log.close()
        return rc


def cli_generate(model, prompt, bits, max_tokens):
    out = subprocess.run([LOWBIT, "--threads", "1", "generate", model, "--prompt", prompt, "--bits", str(bits),
                          "--max-tokens", str(max_tokens), "--no-stats", "--device", "cpu"],
                         check=True, capture_output=True)
    text = out.stdout.decode("utf-8", "replace")
    assert text.startswith(prompt) and text.endswith("\n"), text   # the CLI prints the prompt, the completion, "\n"
    text = text[:-1]
    return text[len(prompt):]


PROMPTS = ["Once upon a time", "Lily and Tom went to the park", "The cat", "It was a sunny day", "Bob had a dog"]


class Stories(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        subprocess.run([LOWBIT, "--threads", "1", "quantize", STORIES, "--method", "anyprec", "--widths", "3,4,8",
                        "--calib-samples", "2", "--calib-seqlen", "64", "-o", ANYPREC], check=True, capture_output=True)
        cls.srv = Server(ANYPREC, "--max-batch", "4", "--ctx", "256", name="stories")
        cls.c = cls.srv.client

    @classmethod
    def tearDownClass(cls):
        assert cls.srv.stop() == 0, "SIGTERM: the server drains and exits 0"

    def test_models(self):
        ids = [m.id for m in self.c.models.list().data]
        self.assertEqual(ids, ["stories", "stories@3bit", "stories@4bit", "stories@8bit"])

    def test_greedy_completion_at_each_width_is_lowbit_generate(self):
        for bits in (3, 4, 8):
            r = self.c.completions.create(model=f"stories@{bits}bit", prompt="Once upon a time", max_tokens=24,
                                          temperature=0)
            self.assertEqual(r.choices[0].text, cli_generate(ANYPREC, "Once upon a time", bits, 24), f"{bits}-bit")
            self.assertIn(r.choices[0].finish_reason, ("length", "stop"))
            self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
            self.assertLessEqual(r.usage.completion_tokens, 24)

    def test_streaming_equals_non_streaming(self):
        full = self.c.completions.create(model="stories", prompt="The cat", max_tokens=30, temperature=0)
        chunks = list(self.c.completions.create(model="stories", prompt="The cat", max_tokens=30, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        self.assertEqual(text, full.choices[0].text)
        self.assertEqual(chunks[-1].usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual([ch.choices[0].finish_reason for ch in chunks if ch.choices][-1], full.choices[0].finish_reason)

    def test_chat_streaming_and_not(self):
        msgs = [{"role": "user", "content": "Tell me a story"}]
        r = self.c.chat.completions.create(model="stories@4bit", messages=msgs, max_tokens=20, temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        chunks = list(self.c.chat.completions.create(model="stories@4bit", messages=msgs, max_tokens=20, temperature=0,
                                                     stream=True))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in chunks), r.choices[0].message.content)

    def test_stop_sequences(self):
        full = self.c.completions.create(model="stories", prompt="Once upon a time", max_tokens=40, temperature=0)
        words = full.choices[0].text.split()
        stop = words[len(words) // 2]
        r = self.c.completions.create(model="stories", prompt="Once upon a time", max_tokens=40, temperature=0,
                                      stop=[stop])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertTrue(full.choices[0].text.startswith(r.choices[0].text))
        self.assertNotIn(stop, r.choices[0].text)

    def test_logprobs(self):
        r = self.c.completions.create(model="stories@8bit", prompt="Once", max_tokens=8, temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), r.usage.completion_tokens)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(p, 0.0)
            self.assertLessEqual(len(top), 2)
            self.assertAlmostEqual(max(top.values()), p, places=4)   # greedy: the chosen token is the likeliest
        c = self.c.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                           temperature=0, logprobs=True, top_logprobs=3)
        content = c.choices[0].logprobs.content
        self.assertEqual(len(content), c.usage.completion_tokens)
        self.assertTrue(all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content))
        streamed = [ch for ch in self.c.chat.completions.create(
            model="stories", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0, logprobs=True,
            stream=True) if ch.choices and ch.choices[0].logprobs]
        self.assertEqual(sum(len(ch.choices[0].logprobs.content) for ch in streamed), c.usage.completion_tokens)

    def test_speculative_requests(self):
        before = self.srv.metrics()["lowbit_speculative_drafted_tokens_total"]
        r = self.c.completions.create(model="stories@8bit", prompt="Once upon a time", max_tokens=40, temperature=0,
                                      extra_body={"draft_bits": 3})
        self.assertEqual(r.choices[0].text, cli_generate(ANYPREC, "Once upon a time", 8, 40))
        self.assertGreater(self.srv.metrics()["lowbit_speculative_drafted_tokens_total"], before)
        with self.assertRaises(openai.UnprocessableEntityError):   # a width the file does not serve
            self.c.completions.create(model="stories@8bit", prompt="x", max_tokens=2, extra_body={"draft_bits": 9})

    def test_server_default_draft(self):
        srv = Server(ANYPREC, "--max-batch", "4", "--ctx", "256", "--draft-bits", "3", name="stories")
        try:
            r = srv.client.completions.create(model="stories@8bit", prompt="The cat", max_tokens=30, temperature=0)
            self.assertEqual(r.choices[0].text, cli_generate(ANYPREC, "The cat", 8, 30))
            self.assertGreater(srv.metrics()["lowbit_speculative_drafted_tokens_total"], 0)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_sampling_is_seeded(self):
        a = self.c.completions.create(model="stories", prompt="The cat", max_tokens=20, temperature=0.9, seed=7,
                                      presence_penalty=0.5, frequency_penalty=0.3)
        b = self.c.completions.create(model="stories", prompt="The cat", max_tokens=20, temperature=0.9, seed=7,
                                      presence_penalty=0.5, frequency_penalty=0.3)
        self.assertEqual(a.choices[0].text, b.choices[0].text)

    def test_errors(self):
        bad = openai.OpenAI(base_url=self.srv.base + "/v1", api_key="wrong", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()
        with self.assertRaises(openai.NotFoundError):
            self.c.completions.create(model="stories@5bit", prompt="x", max_tokens=2)
        with self.assertRaises(openai.UnprocessableEntityError):
            self.c.completions.create(model="stories", prompt="x", max_tokens=2, temperature=5)
        with self.assertRaises(openai.APIStatusError) as e:
            self.c.completions.create(model="stories", prompt="once " * 400, max_tokens=2)
        self.assertEqual(e.exception.status_code, 413)
        with self.assertRaises(openai.UnprocessableEntityError):
            self.c.completions.create(model="stories", prompt="x", n=3)

    def test_concurrent_requests_at_mixed_widths(self):
        jobs = [(PROMPTS[i % len(PROMPTS)], (3, 4, 8)[i % 3], 16 + 4 * (i % 4)) for i in range(12)]
        before = self.srv.metrics()

        def run(job):
            prompt, bits, n = job
            r = self.c.completions.create(model=f"stories@{bits}bit", prompt=prompt, max_tokens=n, temperature=0)
            return r.choices[0].text

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(run, jobs))
        for (prompt, bits, n), text in zip(jobs, texts):
            self.assertEqual(text, cli_generate(ANYPREC, prompt, bits, n), f"{prompt!r} at {bits} bits")
        after = self.srv.metrics()
        steps = after["lowbit_decode_steps_total"] - before["lowbit_decode_steps_total"]
        rows = after["lowbit_decode_rows_total"] - before["lowbit_decode_rows_total"]
        self.assertGreater(rows / steps, 1.5, "requests shared decode steps (continuous batching)")

    def test_fuzz_malformed_requests(self):
        rng = random.Random(1)
        valid = {"model": "stories", "prompt": "hi", "max_tokens": 2}
        fields = ["model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "n",
                  "logprobs", "messages", "stream_options", "presence_penalty", "ignore_eos"]
        junk = [None, -1, 0, 1.5, 1e308, -1e308, "", "x" * 300, [], [1, "a"], {}, {"a": [None]}, True, 2 ** 70]
        statuses = {}
        for i in range(300):
            kind = i % 4
            if kind == 0:      # random bytes
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
            elif kind == 1:    # truncated valid JSON
                s = json.dumps(valid)
                body = s[:rng.randrange(1, len(s))].encode()
            else:              # valid JSON, fields of the wrong type or range
                obj = dict(valid)
                for _ in range(rng.randrange(1, 4)):
                    obj[rng.choice(fields)] = rng.choice(junk)
                body = json.dumps(obj).encode()
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            status, raw = self.srv.post_raw(path, body)
            statuses[status] = statuses.get(status, 0) + 1
            self.assertLess(status, 500, f"{body[:80]!r} -> {status} {raw[:200]!r}")
            if status != 200:
                err = json.loads(raw)["error"]
                self.assertTrue(err["message"] and "\n" not in err["message"], raw)
        status, _ = self.srv.post_raw("/v1/completions", b"{" + b" " * (2 << 20) + b"}")
        self.assertEqual(status, 413, "a body over the limit")
        self.assertEqual(self.c.completions.create(model="stories", prompt="x", max_tokens=1).usage.completion_tokens, 1)
        print(f"\n[fuzz] 300 malformed requests, statuses {dict(sorted(statuses.items()))}; the server still answers",
              flush=True)

    def test_soak_memory_stays_flat(self):
        def one(i):
            kw = dict(model=f"stories@{(3, 4, 8)[i % 3]}bit", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=40,
                      temperature=0.8, seed=i)
            if i % 2:
                return "".join(ch.choices[0].text for ch in self.c.completions.create(stream=True, **kw) if ch.choices)
            return self.c.completions.create(**kw).choices[0].text

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(one, range(60)))   # warm-up: every width, buffers at their working size
        rss0 = self.srv.rss_kib()
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(one, range(60, 360)))
        rss1 = self.srv.rss_kib()
        print(f"\n[soak] 300 requests (6 clients, half streamed, widths 3/4/8) in {time.time() - t0:.1f} s: server RSS "
              f"{rss0 / 1024:.1f} MiB after warm-up -> {rss1 / 1024:.1f} MiB after", flush=True)
        self.assertLess(rss1 - rss0, max(8 * 1024, rss0 // 10), "server memory grows over the soak")
        m = self.srv.metrics()
        self.assertEqual(m["lowbit_running_requests"], 0)
        self.assertEqual(m["lowbit_kv_cache_used_positions"], 0)


@unittest.skipUnless(SMOLLM2 and os.path.exists(SMOLLM2), "SmolLM2 GGUF not fetched (scripts/setup.sh)")
class SmolLM2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server(SMOLLM2, "--max-batch", "2", "--ctx", "1024", name="smollm2")
        cls.c = cls.srv.client

    @classmethod
    def tearDownClass(cls):
        assert cls.srv.stop() == 0

    def test_chat_template(self):
        r = self.c.chat.completions.create(model="smollm2", messages=[
            {"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}],
            max_tokens=12, temperature=0)
        self.assertTrue(r.choices[0].message.content.strip())
        self.assertNotIn("<|im_end|>", r.choices[0].message.content)

    def wait_cancelled(self, before):
        deadline = time.time() + 30
        while time.time() < deadline:
            m = self.srv.metrics()
            if (m.get('lowbit_requests_finished_total{reason="cancelled"}', 0) > before and
                    m["lowbit_running_requests"] == 0 and m["lowbit_kv_cache_used_positions"] == 0):
                return m
            time.sleep(0.1)
        return self.srv.metrics()

    def test_non_streaming_client_that_leaves_cancels(self):
        before = self.srv.metrics().get('lowbit_requests_finished_total{reason="cancelled"}', 0)
        body = json.dumps({"model": "smollm2", "prompt": "Write a long story about a dragon.", "max_tokens": 900,
                           "temperature": 0, "ignore_eos": True}).encode()
        t0 = time.time()
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:   # a client that sends, waits, hangs up
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Authorization: Bearer " + KEY.encode() + b"\r\nAccept-Encoding: gzip\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(2.5)
        m = self.wait_cancelled(before)
        self.assertGreater(m.get('lowbit_requests_finished_total{reason="cancelled"}', 0), before)
        self.assertEqual(m["lowbit_kv_cache_used_positions"], 0)
        self.assertLess(time.time() - t0, 30, "cancelled within seconds of the client leaving")
        # A patient client of a long request still gets its JSON (after the keep-alive spaces).
        r = self.c.completions.create(model="smollm2", prompt="Count to ten:", max_tokens=60, temperature=0,
                                      extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 60)

    def test_request_time_limit(self):
        srv = Server(SMOLLM2, "--max-batch", "2", "--ctx", "1024", "--request-timeout", "2", name="smollm2")
        try:
            t0 = time.time()
            r = srv.client.completions.create(model="smollm2", prompt="Write a long story about a dragon.",
                                              max_tokens=900, temperature=0, extra_body={"ignore_eos": True})
            self.assertEqual(r.choices[0].finish_reason, "length")
            self.assertLess(r.usage.completion_tokens, 900)
            self.assertLess(time.time() - t0, 15)
            self.assertEqual(srv.metrics().get('lowbit_requests_finished_total{reason="timeout"}', 0), 1)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_disconnect_cancels_and_frees_the_cache(self):
        before = self.srv.metrics().get('lowbit_requests_finished_total{reason="cancelled"}', 0)
        stream = self.c.completions.create(model="smollm2", prompt="Write a long story about a dragon.",
                                           max_tokens=800, temperature=0, stream=True, extra_body={"ignore_eos": True})
        got = 0
        for ch in stream:
            got += 1
            if got == 5:
                break
        stream.close()   # the client goes away mid-generation
        m = self.wait_cancelled(before)
        self.assertGreater(m.get('lowbit_requests_finished_total{reason="cancelled"}', 0), before)
        self.assertEqual(m["lowbit_running_requests"], 0)
        self.assertEqual(m["lowbit_kv_cache_used_positions"], 0)
        self.assertLess(m["lowbit_generated_tokens_total"], 800, "generation stopped with the client")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
