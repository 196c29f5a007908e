#!/usr/bin/python3
"""`grpo serve` against hostile clients (run under ASan + UBSan in CI): slowloris, 1,000 idle connections,
oversized headers and bodies, truncated bodies, garbage requests, invalid JSON and UTF-8, wrong types, negative
and huge numbers. After each attack (and during the connection floods) a normal request is still answered,
with the same text as before; at the end SIGTERM stops the server with exit 0 (ASan's leak check included).

usage: /usr/bin/python3 tests/serve/hostile_test.py --grpo PATH --tmp DIR
"""
import argparse
import json
import os
import resource
import shutil
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "rollout"))
import harness  # noqa: E402
import qwen2_ref as ref  # noqa: E402
import serve_test as st  # noqa: E402
import tools_test  # noqa: E402
from harness import check  # noqa: E402

NORMAL = json.dumps({"prompt": "hello", "max_tokens": 8, "temperature": 0}).encode()


def normal(srv):
    """A well-behaved request: its status and text."""
    status, _, body = st.request(srv, "POST", "/v1/completions", NORMAL, timeout=120)
    return status, json.loads(body)["choices"][0]["text"] if status == 200 else body


def attack(srv, name, fn, want):
    fn()
    got = normal(srv)
    check(f"{name}: a normal request is answered after it", got == want, str(got)[:200])


def slowloris(srv, want):
    """200 connections trickle a header byte every 0.3 s; a normal request is answered meanwhile."""
    socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(200)]
    stop = threading.Event()

    def trickle():
        line = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
        for i in range(len(line)):
            if stop.is_set():
                return
            for s in socks:
                try:
                    s.send(line[i:i + 1])
                except OSError:
                    pass
            time.sleep(0.3)
    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    time.sleep(1.0)
    got = normal(srv)
    check("slowloris (200 trickling connections): a normal request is answered during it", got == want, str(got)[:200])
    stop.set()
    for s in socks:
        s.close()


def idle(srv, want):
    """1,000 connections that send nothing; a normal request is answered meanwhile; --timeout closes them."""
    socks = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(1000)]
    got = normal(srv)
    check("1,000 idle connections: a normal request is answered during them", got == want, str(got)[:200])
    time.sleep(3.5)  # --timeout 2
    closed = 0
    for s in socks:
        s.settimeout(0.01)
        try:
            closed += s.recv(1) == b""
        except OSError:
            pass
        s.close()
    check("1,000 idle connections: --timeout closed them", closed >= 990, f"{closed} closed")


def chunked(n, size):
    return [b"%x\r\n" % size + b"x" * size + b"\r\n" for _ in range(n)]


def refused_early(srv):
    """A chunked body past --max-body-mb (1 MiB) is refused once the limit is passed, not read to its end."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    got = st.raw(srv, head + b"".join(chunked(20, 64 << 10)), timeout=8)  # 1.25 MiB, no last chunk: no answer
    # from a server that waits for the rest (it closes at --timeout)
    check("a chunked body past --max-body-mb: 413 as the limit is passed (no last chunk sent)", got == 413, str(got))


def auth_on_headers(model, want):
    """With --api-key-file, an unauthenticated request is answered 401 on its headers: none of its body is waited
    for or kept (today's limit: --max-body-mb x --max-connections of memory for anyone)."""
    key = os.path.join(st.TMP, "key")
    with open(key, "w") as f:
        f.write("k3y\n")
    srv = st.Server(model, "--timeout", 2, "--max-body-mb", 1, "--api-key-file", key)
    try:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500000\r\n%s\r\n"
        for name, auth in (("no key", b""), ("a wrong key", b"Authorization: Bearer nope\r\n")):
            got = st.raw(srv, head % auth, timeout=8)  # a server that waits for the body closes at --timeout
            check(f"--api-key-file, {name}, a 500 kB body not sent: 401 on the headers", got == 401, str(got))
        chunk_head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        got = st.raw(srv, chunk_head + b"".join(chunked(2, 1000)), timeout=8)
        check("--api-key-file, no key, a chunked body: 401 on the headers", got == 401, str(got))
        status, _, body = st.request(srv, "POST", "/v1/completions", NORMAL, {"Authorization": "Bearer k3y"}, 120)
        got = json.loads(body)["choices"][0]["text"] if status == 200 else body
        check("--api-key-file, the key: answered as without one", (status, got) == want, str(got)[:200])
    finally:
        rc = srv.stop(120)
    check("--api-key-file server: exit 0", rc == 0, str(rc))


def bad_bodies():
    """(name, body) of malformed or hostile JSON: each must get a 4xx (but those named "ok: ...", which are
    valid requests), never a crash."""
    deep = b"[" * 100000 + b"]" * 100000
    cases = [("not JSON", b"{"), ("empty", b""), ("array", b"[1, 2]"), ("string", b'"x"'),
             ("invalid UTF-8", b'{"prompt": "\xc3\x28"}'), ("overlong UTF-8", b'{"prompt": "\xc0\xaf"}'),
             ("nested 100k deep", deep), ("ok: NUL in prompt", b'{"prompt": "a\\u0000b", "max_tokens": 2}'),
             ("lone surrogate", b'{"prompt": "\\ud800", "max_tokens": 2}'), ("trailing garbage", b'{"prompt": "a"} x')]
    fields = {"max_tokens": [-1, 1e300, -1e300, 2 ** 63, "8", [], 1.5], "n": [0, -3, 1e9, "2", 2.5],
              "temperature": [-1, 1e308, "hot", float("nan")], "top_p": [0, -1, 7, "x"], "top_k": [-5, 1e12, "k"],
              "seed": [1e30, -1e30, "s", 0.5], "logprobs": [-1, 21, 1e9, "x"], "stop": [1, [1], [""], ["x"] * 100],
              "prompt": [None, 1, [[-1]], [[1e9]], [1.5], [[]], [{"a": 1}], "x" * 100000], "echo": ["yes", 1],
              "stream": ["no"], "stream_options": [1, {"include_usage": "x"}], "model": [7, "nope"]}
    for k, vals in fields.items():
        for v in vals:
            body = {"prompt": "hi", "max_tokens": 2}
            body[k] = v
            text = json.dumps(body) if not (isinstance(v, float) and v != v) else '{"prompt": "hi", "%s": NaN}' % k
            cases.append((f"{k}={str(v)[:20]}", text.encode()))
    chat = [[], [{"role": "user"}], [{"role": 1, "content": "x"}], [{"role": "user", "content": 5}],
            [{"role": "assistant", "content": None, "tool_calls": 3}], [{"role": "user", "content": "x"}] * 3000]
    for m in chat:
        cases.append((f"chat messages {json.dumps(m)[:30]}", json.dumps({"messages": m, "max_tokens": 2}).encode()))
    cases.append(("chat tools not an array", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                         "tools": {"a": 1}}).encode()))
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grpo", required=True)
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    st.GRPO, st.TMP = os.path.abspath(a.grpo), os.path.abspath(a.tmp)
    shutil.rmtree(st.TMP, ignore_errors=True)
    os.makedirs(st.TMP)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    t0 = time.time()
    d = os.path.join(st.TMP, "model")
    tools_test.write_byte_tokenizer(d)
    ref.make_model(d, seed=3, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=260, tied=False,
                   max_pos=512)
    srv = st.Server(d, "--timeout", 2, "--max-body-mb", 1, "--max-header-kb", 16, "--max-batch", 4, "--max-n", 4)
    try:
        want = normal(srv)
        check("baseline: a normal request is answered", want[0] == 200, str(want)[:200])
        slowloris(srv, want)
        idle(srv, want)
        attack(srv, "oversized header (431)", lambda: check(
            "oversized header -> 431", st.raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 +
                                              b"\r\n\r\n") in (413, 431)), want)
        attack(srv, "many headers", lambda: check("many headers -> 431", st.raw(
            srv, b"GET /health HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(5000)) + b"\r\n")
            in (413, 431)), want)
        attack(srv, "oversized body", lambda: check("a body over --max-body-mb -> 413", st.raw(
            srv, st.post_bytes("/v1/completions", b"x" * (3 << 20))) == 413), want)
        attack(srv, "huge Content-Length", lambda: check("Content-Length 10^18 -> 413", st.raw(
            srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000000000\r\n\r\n")
            == 413), want)

        def truncated():
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
            s.close()
            s2 = socket.create_connection(("127.0.0.1", srv.port))  # and one that stalls until --timeout
            s2.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"pro")
            time.sleep(3)
            s2.settimeout(2)
            try:
                check("truncated body that stalls: closed by --timeout", s2.recv(100) == b"")
            except OSError as e:
                check("truncated body that stalls: closed by --timeout", isinstance(e, ConnectionResetError), str(e))
            s2.close()
        attack(srv, "truncated bodies", truncated, want)
        attack(srv, "a chunked body past the limit", lambda: refused_early(srv), want)
        garbage = [b"\x00\xff\xfe garbage\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                   b"DELETE /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", b"POST /v1/completions HTTP/1.0\r\n\r\n",
                   b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                   b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 50]
        attack(srv, "garbage requests", lambda: [st.raw(srv, g) for g in garbage], want)
        bad = []
        for name, body in bad_bodies():
            status = st.raw(srv, st.post_bytes("/v1/completions" if not name.startswith("chat") else
                                               "/v1/chat/completions", body))
            if status != 200 if name.startswith("ok: ") else status is None or not 400 <= status < 500:
                bad.append(f"{name}: {status}")
        check(f"hostile JSON ({len(bad_bodies())} bodies: wrong types, negative and huge numbers, deep nesting, bad "
              f"UTF-8): every one a 4xx", not bad, "; ".join(bad)[:600])
        tok_bad = [(path, b) for path in ("/tokenize", "/detokenize") for b in
                   (b"{", b"", b"[1]", b'{"prompt": "\xc3\x28"}', b"[" * 100000 + b"]" * 100000,
                    b'{"tokens": "x"}', b'{"tokens": [1e300]}', b'{"tokens": [-1]}', b'{"tokens": [[1]]}',
                    b'{"tokens": [1.5]}', b'{"prompt": ["a"]}', b'{"messages": 3}', b'{"messages": [{"role": 1}]}',
                    b'{"prompt": "a", "add_generation_prompt": "yes"}')]
        bad = [f"{p} {b[:30]!r}: {st_}" for p, b in tok_bad
               if not 400 <= (st_ := st.raw(srv, st.post_bytes(p, b)) or 0) < 500]
        check(f"hostile JSON to /tokenize and /detokenize ({len(tok_bad)} bodies): every one a 4xx", not bad,
              "; ".join(bad)[:600])
        got = normal(srv)
        check("hostile JSON: a normal request is answered after them", got == want, str(got)[:200])
    finally:
        rc = srv.stop(120)
    tail = "".join(srv.log)[-1500:]
    check("SIGTERM after the attacks: exit 0 (under ASan: no leak, no error)", rc == 0, f"rc {rc}: {tail}")
    auth_on_headers(d, want)
    return harness.summary(t0)


if __name__ == "__main__":
    sys.exit(main())
