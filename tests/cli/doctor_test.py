#!/usr/bin/env python3
"""`grpo doctor`: every check against fake /sys and /proc trees written here (each branch: PASS, WARN,
FAIL, a PCIe link trained at x8 of x16), a fake NVML library, fake and missing mpirun; then the real
machine against what Python's os/resource/shutil report; exit status and bad options."""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--grpo", required=True)
ap.add_argument("--tmp", required=True)
a = ap.parse_args()
shutil.rmtree(a.tmp, ignore_errors=True)
os.makedirs(a.tmp)
T = lambda *p: os.path.join(a.tmp, *p)
passed = failed = 0


def check(label, ok, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + label + ("" if ok else ": " + str(detail)))
    passed += bool(ok)
    failed += not ok


def write(root, path, text):
    p = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)


LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            {nofile_soft:<20} {nofile_hard:<20} files
Max locked memory         {memlock_soft:<20} {memlock_hard:<20} bytes
"""


def make_root(name, thp="always madvise [never]", numa_bal="0", nodes=None, allowed="0-7", online="0-7",
              nofile=("1048576", "1048576"), memlock=("unlimited", "unlimited"), flags=None, model="Fake CPU 9000",
              mem_kb=(64 << 20, 60 << 20), pci=()):
    root = T(name)
    if thp is not None:
        write(root, "/sys/kernel/mm/transparent_hugepage/enabled", thp + "\n")
    if numa_bal is not None:
        write(root, "/proc/sys/kernel/numa_balancing", numa_bal + "\n")
    write(root, "/sys/devices/system/cpu/online", online + "\n")
    write(root, "/proc/self/status", "Name:\tgrpo\nCpus_allowed:\tff\nCpus_allowed_list:\t%s\n" % allowed)
    nodes = nodes or {0: online}
    write(root, "/sys/devices/system/node/online", ",".join(str(n) for n in nodes) + "\n")
    for n, cl in nodes.items():
        write(root, "/sys/devices/system/node/node%d/cpulist" % n, cl + "\n")
    write(root, "/proc/self/limits", LIMITS.format(nofile_soft=nofile[0], nofile_hard=nofile[1], memlock_soft=memlock[0],
                                                   memlock_hard=memlock[1]))
    flags = build if flags is None else flags  # default: a CPU this binary runs on
    flag_line = "" if flags is False else "flags\t\t: %s\n" % " ".join(flags)  # False: no flags line (ARM)
    write(root, "/proc/cpuinfo", "processor\t: 0\nmodel name\t: %s\n%s\n" % (model, flag_line))
    write(root, "/proc/meminfo", "MemTotal:       %d kB\nMemFree:        1 kB\nMemAvailable:   %d kB\n" % mem_kb)
    os.makedirs(os.path.join(root, "sys/bus/pci/devices"), exist_ok=True)
    for bdf, cls, cw, mw, cs, ms in pci:
        d = "/sys/bus/pci/devices/" + bdf
        for k, v in (("class", cls), ("vendor", "0x10de"), ("device", "0x2335"), ("current_link_width", cw),
                     ("max_link_width", mw), ("current_link_speed", cs), ("max_link_speed", ms)):
            write(root, d + "/" + k, v + "\n")
    return root


def doctor(*args, env=None, expect_json=True):
    e = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "GRPO_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        e.pop(k, None)  # (a capped CI pass sets the ISA caps: they are tested below)
    e["GRPO_DOCTOR_NVML"] = T("no-nvml.so")
    e.update(env or {})
    p = subprocess.run([a.grpo, "doctor"] + list(args), capture_output=True, text=True, env=e, timeout=60)
    if not expect_json:
        return p, None
    try:
        return p, {c["id"]: c for c in json.loads(p.stdout)["checks"]}
    except (ValueError, KeyError) as ex:
        return p, {"_error": str(ex) + p.stderr}


# The build's vector features, as the binary reports them (checked against the real CPU below).
_, real = doctor("--json")
build = real["cpu"]["values"]["build_features"]
all_feats = ["avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "avx512f", "avx512dq", "avx512bw", "avx512vl",
             "avx512_bf16", "amx_bf16", "amx_tile"]

# --- THP, NUMA balancing, cores/affinity --------------------------------------------------------------
cases = [  # (label, make_root kwargs, {check id: expected status})
    ("thp never", dict(thp="always madvise [never]"), {"thp": "PASS"}),
    ("thp madvise", dict(thp="always [madvise] never"), {"thp": "PASS"}),
    ("thp always", dict(thp="[always] madvise never"), {"thp": "WARN"}),
    ("thp absent", dict(thp=None), {"thp": "PASS"}),
    ("numa_balancing 1 on 2 nodes, process spans both",
     dict(numa_bal="1", nodes={0: "0-3", 1: "4-7"}), {"numa_balancing": "WARN", "cpus": "WARN"}),
    ("numa_balancing 0 on 2 nodes, process bound to node 1",
     dict(numa_bal="0", nodes={0: "0-3", 1: "4-7"}, allowed="4-7"), {"numa_balancing": "PASS", "cpus": "PASS"}),
    ("numa_balancing 1 on 1 node", dict(numa_bal="1"), {"numa_balancing": "PASS", "cpus": "PASS"}),
    ("nofile 1024 (default)", dict(nofile=("1024", "524288")), {"nofile": "WARN"}),
    ("nofile 256", dict(nofile=("256", "256")), {"nofile": "FAIL"}),
    ("nofile unlimited", dict(nofile=("unlimited", "unlimited")), {"nofile": "PASS"}),
    ("memlock 64 KiB", dict(memlock=("65536", "65536")), {"memlock": "WARN"}),
    ("memlock unlimited", dict(memlock=("unlimited", "unlimited")), {"memlock": "PASS"}),
    ("cpu with exactly the build's features", dict(flags=["fpu", "sse2"] + build),
     {"cpu": "PASS"}),
    ("cpu with every feature", dict(flags=["sse2", "avx"] + all_feats), {"cpu": "PASS"}),
    ("cpu with no vector flags", dict(flags=[]), {"cpu": "FAIL" if build else "PASS"}),
    ("cpu without a flags line", dict(flags=False), {"cpu": "WARN"}),
    ("pcie x16 and a x8-of-x16 GPU, a slow NIC ignored",
     dict(pci=[("0000:17:00.0", "0x030200", "16", "16", "32.0 GT/s PCIe", "32.0 GT/s PCIe"),
               ("0000:65:00.0", "0x030200", "8", "16", "32.0 GT/s PCIe", "32.0 GT/s PCIe"),
               ("0000:b3:00.0", "0x120000", "16", "16", "2.5 GT/s PCIe", "16.0 GT/s PCIe"),
               ("0000:03:00.0", "0x020000", "1", "16", "2.5 GT/s PCIe", "8.0 GT/s PCIe")]),
     {"pcie:0000:17:00.0": "PASS", "pcie:0000:65:00.0": "WARN", "pcie:0000:b3:00.0": "WARN"}),
    ("no PCI display devices", dict(), {"pcie": "PASS"}),
    ("memory without config", dict(), {"memory": "PASS"}),
]
if build:  # a CPU that lacks one feature the binary uses: it would die of SIGILL
    cases.append(("cpu lacking %s" % build[-1], dict(flags=["sse2"] + build[:-1]), {"cpu": "FAIL"}))
for i, (label, kw, want) in enumerate(cases):
    root = make_root("root%d" % i, **kw)
    p, got = doctor("--json", "--root", root)
    bad = {k: (got.get(k, {}).get("status"), v) for k, v in want.items() if got.get(k, {}).get("status") != v}
    fails = any(c.get("status") == "FAIL" for c in got.values() if isinstance(c, dict))
    check("status: " + label, not bad and p.returncode == (1 if fails else 0), (bad, p.returncode, p.stderr[-300:]))
    if label.startswith("pcie"):
        check("pcie: only display/accelerator devices reported", not any(k == "pcie:0000:03:00.0" for k in got)
              and sum(k.startswith("pcie:") for k in got) == 3, list(got))
        v = got["pcie:0000:65:00.0"]["values"]
        check("pcie: x8 of x16 values", (v["current_width"], v["max_width"], v["current_speed_gts"], v["max_speed_gts"],
                                          v["class"]) == (8, 16, 32.0, 32.0, "0x030200"), v)
    if "nofile" in want:
        soft, hard = kw["nofile"]
        num = lambda s: None if s == "unlimited" else int(s)
        v = got["nofile"]["values"]
        check("nofile values from proc/self/limits: " + label,
              (v["soft"], v["hard"], v["source"]) == (num(soft), num(hard), "proc/self/limits"), v)
    if "cpus" in want:
        nodes = kw.get("nodes", {0: "0-7"})
        v = got.get("cpus", {}).get("values", {})
        exp_allowed = len(range(4, 8)) if kw.get("allowed") == "4-7" else 8
        check("cpus values: " + label, (v.get("cpus_online"), v.get("cpus_allowed"), v.get("numa_nodes")) == (8, exp_allowed, len(nodes)), v)

# --- fixed values: THP mode, meminfo, cpu model -------------------------------------------------------
root = make_root("values", thp="always [madvise] never", mem_kb=(123456789, 98765432), model="Xeon <Fake> 1234")
_, got = doctor("--json", "--root", root)
check("thp mode value", got["thp"]["values"]["mode"] == "madvise", got["thp"])
check("meminfo bytes", (got["memory"]["values"]["mem_total_bytes"], got["memory"]["values"]["mem_available_bytes"])
      == (123456789 * 1024, 98765432 * 1024), got["memory"]["values"])
check("cpu model", got["cpu"]["values"]["model"] == "Xeon <Fake> 1234", got["cpu"]["values"])
check("fix commands for WARN/FAIL, none for PASS",
      all(bool(c["fix"]) == (c["status"] != "PASS") for c in got.values()),
      [(c["id"], c["status"], c["fix"]) for c in got.values()])

# --- threads (environment) -----------------------------------------------------------------------------
root = make_root("threads")  # 8 allowed CPUs
for label, env, ranks, want in [("unset, 1 rank", {}, 1, "PASS"), ("unset, 2 ranks", {}, 2, "WARN"),
                                ("OMP 4 x 2 ranks", {"OMP_NUM_THREADS": "4"}, 2, "PASS"),
                                ("OMP 16 on 8 CPUs", {"OMP_NUM_THREADS": "16"}, 1, "WARN"),
                                ("OMP garbage", {"OMP_NUM_THREADS": "lots"}, 1, "FAIL")]:
    p, got = doctor("--json", "--root", root, "--ranks", str(ranks), env=env)
    t = got.get("threads", {})
    check("threads: " + label, t.get("status") == want and p.returncode == (1 if want == "FAIL" else 0)
          and t["values"]["ranks"] == ranks, (t, p.returncode))

# --- MPI (PATH) ----------------------------------------------------------------------------------------
fake_bin = T("fakebin")
os.makedirs(fake_bin)
with open(os.path.join(fake_bin, "mpirun"), "w") as f:
    f.write("#!/bin/sh\necho 'mpirun (Fake MPI) 9.9.9'\necho 'second line'\n")
os.chmod(os.path.join(fake_bin, "mpirun"), 0o755)
empty_bin = T("emptybin")
os.makedirs(empty_bin)
for label, path, ranks, want, ver in [("fake mpirun", fake_bin, 1, "PASS", "mpirun (Fake MPI) 9.9.9"),
                                      ("no mpirun, 1 rank", empty_bin, 1, "PASS", None),
                                      ("no mpirun, 4 ranks", empty_bin, 4, "WARN", None)]:
    _, got = doctor("--json", "--root", root, "--ranks", str(ranks), env={"PATH": path})
    m = got.get("mpi", {})
    exp_path = os.path.join(fake_bin, "mpirun") if ver else None
    check("mpi: " + label, m.get("status") == want and m["values"]["version"] == ver and m["values"]["path"] == exp_path, m)
real_mpi = shutil.which("mpirun")
_, got = doctor("--json")
if real_mpi:
    line = subprocess.run([real_mpi, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    check("mpi: real mpirun and its version", got["mpi"]["values"]["path"] == real_mpi
          and got["mpi"]["values"]["version"] == line, got["mpi"])
else:
    check("mpi: none on this machine", got["mpi"]["values"]["path"] is None and got["mpi"]["status"] == "PASS", got["mpi"])

# --- GPUs through a fake NVML ----------------------------------------------------------------------------
check("gpu: no NVML library means none, PASS", got["gpu"]["status"] == "PASS" and got["gpu"]["values"]["count"] == 0, got["gpu"])
cc = shutil.which("cc") or shutil.which("gcc")
if cc:
    src = T("fake_nvml.c")
    with open(src, "w") as f:
        f.write(r"""
#include <string.h>
typedef struct { unsigned long long total, free, used; } Mem;
static int ids[2];
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = &ids[i]; return 0; }
int nvmlDeviceGetName(void *h, char *s, unsigned n) { strncpy(s, h == &ids[0] ? "Fake H200" : "Fake H200 b", n); return 0; }
int nvmlDeviceGetMemoryInfo(void *h, Mem *m) { m->total = 150ULL << 30; m->used = h == &ids[0] ? 1ULL << 30 : 2ULL << 30; m->free = m->total - m->used; return 0; }
int nvmlDeviceGetTemperature(void *h, int s, unsigned *t) { (void)s; *t = h == &ids[0] ? 40 : 50; return 0; }
int nvmlDeviceGetTotalEccErrors(void *h, int t, int c, unsigned long long *n) { (void)t; (void)c; *n = h == &ids[0] ? 0 : 3; return 0; }
""")
    so = T("libfake_nvml.so")
    subprocess.run([cc, "-shared", "-fPIC", "-o", so, src], check=True)
    _, got = doctor("--json", env={"GRPO_DOCTOR_NVML": so})
    g0, g1 = got.get("gpu:0", {}), got.get("gpu:1", {})
    check("gpu: fake NVML count", got["gpu"]["values"]["count"] == 2 and got["gpu"]["status"] == "PASS", got["gpu"])
    check("gpu:0 healthy", g0.get("status") == "PASS" and g0["values"]["name"] == "Fake H200"
          and g0["values"]["memory_total_bytes"] == 150 << 30 and g0["values"]["memory_used_bytes"] == 1 << 30
          and g0["values"]["temperature_c"] == 40 and g0["values"]["ecc_uncorrected"] == 0, g0)
    check("gpu:1 with uncorrected ECC errors WARNs", g1.get("status") == "WARN" and g1["values"]["ecc_uncorrected"] == 3, g1)
    with open(src, "w") as f:
        f.write("int nvmlInit_v2(void) { return 9; }\nint nvmlShutdown(void) { return 0; }\n"
                "int nvmlDeviceGetCount_v2(unsigned *n) { *n = 0; return 0; }\n"
                "int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { (void)i; *h = 0; return 0; }\n"
                "int nvmlDeviceGetName(void *h, char *s, unsigned n) { (void)h; (void)s; (void)n; return 0; }\n"
                "int nvmlDeviceGetMemoryInfo(void *h, void *m) { (void)h; (void)m; return 0; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", so + ".2", src], check=True)
    p, got = doctor("--json", env={"GRPO_DOCTOR_NVML": so + ".2"})
    check("gpu: NVML that does not start FAILs, exit 1", got["gpu"]["status"] == "FAIL" and p.returncode == 1, got["gpu"])
else:
    check("gpu: a C compiler for the fake NVML", False, "no cc on PATH")

# --- memory and disk for a config ------------------------------------------------------------------------
model = T("model")
subprocess.run([a.grpo, "init", "--out", model, "--preset", "tiny"], check=True, capture_output=True)
cfg = T("run.yaml")
with open(cfg, "w") as f:
    f.write("model:\n  path: %s\ntrainer:\n  out_dir: %s\n" % (model, T("out", "run1")))
root = make_root("mem")
_, got = doctor("--json", "--root", root, "--config", cfg)
need = got["memory"]["values"]["needed_bytes"]
ck = got["disk"]["values"]
check("memory: config sized, fits in 60 GiB", got["memory"]["status"] == "PASS" and need > 0, got["memory"])
check("disk: nearest existing parent of trainer.out_dir", ck["path"] == a.tmp and got["disk"]["status"] == "PASS", ck)
st = os.statvfs(a.tmp)
check("disk: free bytes match os.statvfs", abs(ck["free_bytes"] - st.f_bavail * st.f_frsize) < 256 << 20, ck)
check("disk: needed = (keep+1) checkpoints + model", ck["needed_bytes"] > (ck["keep"] + 1) * ck["checkpoint_bytes"], ck)
avail_kb = int(need / 1024 / 0.9)  # needed is 90% of available: WARN
for label, kb, want in [("memory: needed > available FAILs", need // 1024 // 2, "FAIL"),
                        ("memory: needed > 80% of available WARNs", avail_kb, "WARN")]:
    root = make_root("mem_" + want, mem_kb=(kb * 2, kb))
    p, got = doctor("--json", "--root", root, "--config", cfg)
    check(label, got["memory"]["status"] == want and got["memory"]["values"]["mem_available_bytes"] == kb * 1024
          and p.returncode == (1 if want == "FAIL" else 0), got["memory"])
free = ck["free_bytes"]
keep_warn = max(1, int(0.75 * free / ck["checkpoint_bytes"]))  # needed between free/2 and free
for label, keep, want in [("disk: keep too many checkpoints FAILs", 4 * int(free / ck["checkpoint_bytes"]) + 4, "FAIL"),
                          ("disk: under 2x headroom WARNs", keep_warn, "WARN")]:
    _, got = doctor("--json", "--root", root, "--config", cfg, "trainer.keep=%d" % keep)
    check(label, got["disk"]["status"] == want and got["disk"]["values"]["keep"] == keep, got["disk"])
with open(T("nomodel.yaml"), "w") as f:
    f.write("trainer:\n  keep: 3\n")
_, got = doctor("--json", "--config", T("nomodel.yaml"))
check("memory: config without model.path WARNs", got["memory"]["status"] == "WARN" and "model.path" in got["memory"]["observed"],
      got["memory"])
_, got = doctor("--json", "--config", T("nomodel.yaml"), "model.path=" + T("missing-model"))
check("memory: model dir without config.json WARNs", got["memory"]["status"] == "WARN", got["memory"])

# --- the real machine vs Python ------------------------------------------------------------------------
p, got = doctor("--json")
doc = json.loads(p.stdout)
for name, res in (("nofile", resource.RLIMIT_NOFILE), ("memlock", resource.RLIMIT_MEMLOCK)):
    soft, hard = resource.getrlimit(res)
    conv = lambda x: None if x == resource.RLIM_INFINITY else x
    v = got[name]["values"]
    check("real %s = resource.getrlimit" % name, (v["soft"], v["hard"], v["source"]) == (conv(soft), conv(hard), "getrlimit"), v)
v = got["cpus"]["values"]
check("real cpus = os.cpu_count / sched_getaffinity",
      (v["cpus_online"], v["cpus_allowed"]) == (os.cpu_count(), len(os.sched_getaffinity(0))), v)
try:
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1].split("]")[0]
except (OSError, IndexError):
    thp = None
check("real thp mode", got["thp"]["values"]["mode"] == thp, got["thp"])
mem = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/meminfo")}
check("real MemTotal", got["memory"]["values"]["mem_total_bytes"] == mem["MemTotal"], got["memory"])
flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
check("build features all on the real CPU", set(build) <= set(flags) and got["cpu"]["status"] != "FAIL", got["cpu"])
check("the portable build needs x86-64-v3 and no more",
      {"avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"} <= set(build) and not any("512" in f for f in build),
      build)


# The instruction-set level: this process's (CPUID) against the kernel's flags; GRPO_CPU_ISA caps it and oneDNN.
def level_of(fl):
    lv = "avx2"
    for name, need in (("avx512", {"avx512f", "avx512dq", "avx512bw", "avx512vl"}), ("avx512_bf16", {"avx512_bf16"}),
                       ("amx", {"amx_bf16", "amx_tile"})):
        if not need <= set(fl):
            break
        lv = name
    return lv


v = got["cpu"]["values"]
machine = level_of(flags)
check("real isa level = the flags' level, uncapped", (v["isa_machine"], v["isa_level"], v["isa_cap"]) ==
      (machine, machine, None) and got["cpu"]["status"] == "PASS", v)
check("bf16 on oneDNN at avx512 and above", v["bf16_matmul"] == ("widened" if machine == "avx2" else "onednn"), v)
_, capped = doctor("--json", env={"GRPO_CPU_ISA": "avx2"})
v = capped["cpu"]["values"]
check("GRPO_CPU_ISA=avx2: kernels, oneDNN and bf16 at AVX2; WARN when the CPU has more",
      (v["isa_level"], v["isa_cap"], v["onednn_isa"], v["bf16_matmul"], v["bf16_decode"]) ==
      ("avx2", "GRPO_CPU_ISA=avx2", "avx2", "widened", "avx2") and
      capped["cpu"]["status"] == ("PASS" if machine == "avx2" else "WARN"), capped["cpu"])
_, capped = doctor("--json", env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
v = capped["cpu"]["values"]
check("ONEDNN_MAX_CPU_ISA=AVX2 caps our kernels too", (v["isa_level"], v["onednn_isa"], v["isa_cap"]) ==
      ("avx2", "avx2", "ONEDNN_MAX_CPU_ISA=AVX2"), v)
bad, _ = doctor("--json", env={"GRPO_CPU_ISA": "sse2"}, expect_json=False)
check("GRPO_CPU_ISA=sse2: one error line naming the values, exit 1",
      bad.returncode == 1 and bad.stderr.count("\n") == 1 and "GRPO_CPU_ISA=sse2: expected avx2, avx512" in bad.stderr,
      (bad.returncode, bad.stderr))
n_pci = 0
for dev in sorted(os.listdir("/sys/bus/pci/devices")) if os.path.isdir("/sys/bus/pci/devices") else []:
    cls = open("/sys/bus/pci/devices/%s/class" % dev).read().strip()
    n_pci += int(cls, 16) >> 16 in (0x03, 0x12)
check("real pcie devices = sysfs display/accelerator count",
      sum(k.startswith("pcie:") for k in got) == n_pci and (n_pci or "pcie" in got), list(got))
check("json: stable top-level keys", set(doc) == {"root", "status", "counts", "checks"} and all(
    set(c) == {"id", "status", "observed", "recommended", "fix", "values"} for c in doc["checks"]), list(doc))
check("json: counts and status agree", sum(doc["counts"].values()) == len(doc["checks"]) and doc["status"] ==
      max((c["status"] for c in doc["checks"]), key=["PASS", "WARN", "FAIL"].index), doc["counts"])
check("json: exit status 1 exactly when a FAIL", p.returncode == (1 if doc["counts"]["FAIL"] else 0), p.returncode)
t, _ = doctor(expect_json=False)
lines = [l for l in t.stdout.splitlines() if l[:4] in ("PASS", "WARN", "FAIL")]
check("text: one line per check, same statuses as --json",
      [(l.split()[0], l.split()[1]) for l in lines] == [(c["status"], c["id"]) for c in doc["checks"]], lines)
root = make_root("envroot", thp="[always] madvise never")
_, got = doctor("--json", env={"GRPO_DOCTOR_ROOT": root})
check("GRPO_DOCTOR_ROOT selects the root", got["thp"]["status"] == "WARN", got.get("thp"))

# --- bad input: one error line, exit 1 -----------------------------------------------------------------
for label, args, needle in [("unknown option", ["--frobnicate"], "--frobnicate"),
                            ("--ranks 0", ["--ranks", "0"], "--ranks"),
                            ("--ranks not a number", ["--ranks", "x"], "--ranks"),
                            ("--root missing", ["--root", T("nope")], "nope"),
                            ("--config missing", ["--config", T("nope.yaml")], "nope.yaml"),
                            ("override without --config", ["trainer.keep=2"], "trainer.keep=2"),
                            ("bad config key", ["--config", cfg, "trainer.kepp=2"], "trainer.kepp")]:
    p, _ = doctor(*args, expect_json=False)
    err = [l for l in p.stderr.splitlines() if l.strip()]
    check("error: " + label, p.returncode == 1 and len(err) == 1 and err[0].startswith("grpo: error:") and needle in err[0]
          and not p.stdout, (p.returncode, p.stderr))
root = make_root("badlimits")
write(root, "/proc/self/limits", "Max open files            lots\n")
p, _ = doctor("--json", "--root", root, expect_json=False)
check("error: malformed limits file names it", p.returncode == 1 and "limits" in p.stderr and "Max open files" in p.stderr,
      p.stderr)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
