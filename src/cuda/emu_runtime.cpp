// The emulated device's runtime (emu.h): the block scheduler (threads as fibers, barriers and warp intrinsics that
// check who takes part), launches, and device memory (a registry of host allocations).
//
// Under ThreadSanitizer this file is compiled without TSan's instrumentation (GRPO_EMU_TSAN): the scheduler
// touches every thread's state from its own context, which would read as races between the fibers; it tells TSan
// where the fibers switch and which operations order their memory instead.
#include "cuda/emu.h"

#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>

extern "C" {
#include "base/util.h"
}

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif

#ifdef EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
extern "C" void __asan_poison_memory_region(void const volatile *addr, size_t size);
extern "C" void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#endif
#ifdef GRPO_EMU_TSAN
extern "C" void *__tsan_get_current_fiber(void);
extern "C" void *__tsan_create_fiber(unsigned flags);
extern "C" void __tsan_switch_to_fiber(void *fiber, unsigned flags);
extern "C" void __tsan_acquire(void *addr);
extern "C" void __tsan_release(void *addr);
#define TSAN_NO_SYNC 1u  // __tsan_switch_to_fiber_no_sync: a switch orders nothing
#endif

// void grpo_emu_switch(void **save_sp, void *to_sp): saves the callee-saved registers, MXCSR and the x87
// control word on this stack, stores its pointer in *save_sp and resumes the context saved at to_sp (x86-64
// System V).
__asm__(".text\n"
        ".globl grpo_emu_switch\n"
        ".hidden grpo_emu_switch\n"
        ".type grpo_emu_switch,@function\n"
        "grpo_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size grpo_emu_switch, .-grpo_emu_switch\n");
extern "C" void grpo_emu_switch(void **save_sp, void *to_sp);

namespace emu {

void flush_all_streams();  // every stream's pending copies (below, with the runtime API)

namespace {
thread_local const Ids *ids;
}

const Ids *current() { return ids; }

namespace {

#ifdef EMU_ASAN
const size_t STACK = 512u << 10;  // ASan's frames are larger
#else
const size_t STACK = 128u << 10;
#endif
const size_t GUARD = 4096;  // below each stack: an overflow faults instead of writing into the next one
const int MAX_THREADS = 1024;
const size_t MAX_DYNAMIC_SHARED = 48u << 10;  // without cudaFuncSetAttribute

enum State { READY, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
    void *sp;
    char *stack;  // its lowest address; STACK bytes
    Ids ids;
    State state;
    const char *file;  // where it waits
    int line;
    int op;           // WarpOp or BarrierOp
    unsigned mask;    // a warp op's
    uint64_t value;   // a warp op's value, a barrier's predicate; then the result
    int arg, width;   // a shuffle's lane argument and width
    unsigned wsync;   // __syncwarp()s this thread passed in its block (TSan: which of its two objects it releases)
    void *tsan;
    void *asan_fake;
};

struct Launch;

// What runs blocks on one host thread: the fibers (made on first need, kept for later launches) and the block
// being run.
struct Sched {
    Fiber *f;
    int cap;  // fibers made so far
    char *stacks;
    void *main_sp;
    Launch *L;
    int n, cur;
    unsigned gen;  // barriers passed in this block
    const void *main_bottom;
    size_t main_size;
    void *main_fake, *tsan_main;
    // TSan's synchronisation objects: barrier generations; each thread's __syncwarp arrivals (two, alternating) and
    // which one its last completed __syncwarp used; the blocks this host thread started and the ones it finished
    char bar_sync[2], lane_sync[MAX_THREADS][2], start_sync, end_sync;
    unsigned char lane_parity[MAX_THREADS];
    char *smem;
    size_t smem_cap;
};

struct Launch {
    const char *kernel, *file;
    int line;
    dim3 grid, block;
    size_t smem;
    ThreadFn fn;
    void *closure;
    int threads;
    std::mutex mu;
    std::atomic<int> failed;  // the first error, then no block runs on
    char error[1024];
    char launch_sync, end_sync;  // TSan: the launch before every thread; every thread before the end
};

// The emulated device: its allocations and the schedulers of the host threads that ran blocks. Made once and
// never freed: an error may stop the process from a fiber's stack.
struct Device {
    std::mutex mu;
    std::map<uintptr_t, size_t> allocs;  // base -> bytes
    std::map<uintptr_t, size_t> pinned;  // cudaHostAlloc's: base -> bytes
    std::map<pthread_t, Sched *> scheds;
    std::recursive_mutex streams_mu;     // the streams' queues (a flush runs copies, which take mu)
    std::map<uint64_t, EmuStream *> streams;  // by id: an event of a destroyed stream finds none (complete)
    uint64_t next_stream = 1;
};

Device &device() {
    static Device *d = new Device;
    return *d;
}

thread_local Sched *tls;

void fail(Launch *L, const char *fmt, ...) {
    std::lock_guard<std::mutex> g(L->mu);
    if (L->failed) return;
    L->failed = 1;
    int k = snprintf(L->error, sizeof L->error, "emulated device: kernel %s (%s:%d): ", L->kernel, L->file, L->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->error + k, sizeof L->error - (size_t)k, fmt, ap);
    va_end(ap);
}

const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

const char *warp_op_name(int op) {
    static const char *const names[] = {"__shfl_sync",   "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                        "__ballot_sync", "__all_sync",     "__any_sync",       "__syncwarp"};
    return names[op];
}

const char *barrier_name(int op) {
    static const char *const names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                        "__syncthreads_or"};
    return names[op];
}

// ---------------------------------------------------------------------------------------------
// fibers

void yield(Sched *s, Fiber *f);

// A fiber's first frame: runs the kernel for its thread, then leaves for good.
void fiber_entry() {
    Sched *s = tls;
    Fiber *f = &s->f[s->cur];
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &s->main_bottom, &s->main_size);
#endif
#ifdef GRPO_EMU_TSAN
    __tsan_acquire((void *)&s->L->launch_sync);
    __tsan_acquire(&s->start_sync);
#endif
    s->L->fn(s->L->closure);
#ifdef GRPO_EMU_TSAN
    __tsan_release((void *)&s->L->end_sync);
    __tsan_release(&s->end_sync);
#endif
    f->state = DONE;
    yield(s, f);
    abort();  // never resumed
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
void yield(Sched *s, Fiber *f) {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(f->state == DONE ? NULL : &f->asan_fake, s->main_bottom, s->main_size);
#endif
#ifdef GRPO_EMU_TSAN
    __tsan_switch_to_fiber(s->tsan_main, TSAN_NO_SYNC);
#endif
    grpo_emu_switch(&f->sp, s->main_sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, NULL, NULL);
#endif
}

void resume(Sched *s, int t) {
    Fiber *f = &s->f[t];
    s->cur = t;
    ids = &f->ids;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&s->main_fake, f->stack, STACK);
#endif
#ifdef GRPO_EMU_TSAN
    __tsan_switch_to_fiber(f->tsan, TSAN_NO_SYNC);
#endif
    grpo_emu_switch(&s->main_sp, f->sp);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(s->main_fake, NULL, NULL);
#endif
}

// Fiber t's stack as if grpo_emu_switch had saved a context that returns into fiber_entry.
void fiber_start(Fiber *f) {
    uintptr_t top = ((uintptr_t)f->stack + STACK) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                                // fiber_entry's return address (it never returns)
    *--sp = (uint64_t)(uintptr_t)fiber_entry;  // where grpo_emu_switch's ret goes
    for (int r = 0; r < 6; r++) *--sp = 0;    // rbp rbx r12 r13 r14 r15
    *--sp = 0x1f80ull | (0x037full << 32);    // MXCSR and x87 control word: the ABI's defaults
    f->sp = sp;
    f->state = READY;
}

Sched *sched_new() {
    Sched *s = (Sched *)xcalloc(1, sizeof *s);
    s->f = (Fiber *)xcalloc(MAX_THREADS, sizeof *s->f);
    size_t bytes = (size_t)MAX_THREADS * (STACK + GUARD);
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die("emulated device: cannot map %zu MB of thread stacks", bytes >> 20);
    s->stacks = (char *)m;
    for (int t = 0; t < MAX_THREADS; t++) {
        char *g = s->stacks + (size_t)t * (STACK + GUARD);
        if (mprotect(g, GUARD, PROT_NONE) != 0) die("emulated device: cannot protect a stack guard page");
        s->f[t].stack = g + GUARD;
    }
    return s;
}

// This host thread's scheduler.
Sched *sched_of_thread() {
    if (tls) return tls;
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    Sched *&s = d.scheds[pthread_self()];
    if (!s) s = sched_new();
    tls = s;
    return s;
}

void ensure_fibers(Sched *s, int n) {
#ifdef GRPO_EMU_TSAN
    for (; s->cap < n; s->cap++) s->f[s->cap].tsan = __tsan_create_fiber(0);
#else
    if (s->cap < n) s->cap = n;
#endif
}

// ---------------------------------------------------------------------------------------------
// synchronisation: the scheduler's side

int lane_count(const Sched *s, int w0) { return s->n - w0 < 32 ? s->n - w0 : 32; }

// One warp intrinsic whose lanes have all arrived: every lane's result.
void warp_complete(Sched *s, Launch *L, int w0, unsigned mask) {
    Fiber *f = &s->f[w0];
    uint64_t vote = 0;
    int all = 1, any = 0;
    for (int j = 0; j < 32; j++) {
        if (!(mask >> j & 1)) continue;
        vote |= (uint64_t)(f[j].value != 0) << j;
        all &= f[j].value != 0;
        any |= f[j].value != 0;
    }
    uint64_t result[32];
    for (int j = 0; j < 32; j++) {
        if (!(mask >> j & 1)) continue;
        int op = f[j].op, w = f[j].width, base = j & ~(w - 1), src = j;
        if (op == WARP_SHFL) src = base + (f[j].arg & (w - 1));
        if (op == WARP_SHFL_UP) src = j - f[j].arg >= base ? j - f[j].arg : j;
        if (op == WARP_SHFL_DOWN) src = j + f[j].arg < base + w ? j + f[j].arg : j;
        if (op == WARP_SHFL_XOR) src = (j ^ f[j].arg) < base + w ? j ^ f[j].arg : j;  // earlier groups are read
        if (src < 0 || src > 31 || !(mask >> src & 1)) {
            const Fiber *x = &f[j];
            fail(L, "block (%u,%u,%u): %s at %s:%d: lane %d of warp %d reads lane %d, which is not in the mask "
                 "0x%08x", x->ids.block.x, x->ids.block.y, x->ids.block.z, warp_op_name(op), base_name(x->file),
                 x->line, j, w0 / 32, src, mask);
            return;
        }
        result[j] = op == WARP_BALLOT ? vote : op == WARP_ALL ? (uint64_t)all : op == WARP_ANY ? (uint64_t)any
                                                                                               : f[src].value;
    }
    for (int j = 0; j < 32; j++) {
        if (!(mask >> j & 1)) continue;
        f[j].value = result[j];
        f[j].state = READY;
    }
    for (int j = 0; j < 32 && f[__builtin_ctz(mask)].op == WARP_SYNC; j++) {
        if (!(mask >> j & 1)) continue;
        s->lane_parity[w0 + j] = f[j].wsync & 1;  // the object it released on arrival, for its partners' acquires
        f[j].wsync++;
    }
}

// Completes every warp intrinsic whose mask's lanes all wait at it; returns how many.
int resolve_warps(Sched *s, Launch *L) {
    int done = 0;
    for (int w0 = 0; w0 < s->n && !L->failed; w0 += 32) {
        Fiber *f = &s->f[w0];
        for (int l = 0; l < lane_count(s, w0); l++) {
            if (f[l].state != AT_WARP) continue;
            unsigned m = f[l].mask;
            int ready = 1;
            for (int j = 0; j < 32 && ready; j++) {
                const Fiber *g = &f[j];
                if (m >> j & 1)
                    ready = g->state == AT_WARP && g->mask == m && g->op == f[l].op && g->line == f[l].line &&
                            g->file == f[l].file;
            }
            if (!ready) continue;
            warp_complete(s, L, w0, m);
            done++;
        }
    }
    return done;
}

// Releases the block's barrier when every thread waits at the same one; returns 1 if it did.
int release_barrier(Sched *s) {
    Fiber *f = s->f;
    for (int t = 0; t < s->n; t++)
        if (f[t].state != AT_BARRIER || f[t].line != f[0].line || f[t].file != f[0].file || f[t].op != f[0].op)
            return 0;
    int count = 0;
    for (int t = 0; t < s->n; t++) count += f[t].value != 0;
    int op = f[0].op;
    int result = op == BARRIER_COUNT ? count : op == BARRIER_AND ? count == s->n : op == BARRIER_OR ? count > 0 : 0;
    for (int t = 0; t < s->n; t++) {
        f[t].value = (uint64_t)result;
        f[t].state = READY;
    }
    s->gen++;
    return 1;
}

// Where thread t is: "waits at __syncthreads() (backend.cuh:120)", "returned", ...
void describe(const Fiber *f, char *buf, size_t n) {
    if (f->state == DONE) snprintf(buf, n, "returned");
    else if (f->state == AT_BARRIER)
        snprintf(buf, n, "waits at %s() (%s:%d)", barrier_name(f->op), base_name(f->file), f->line);
    else
        snprintf(buf, n, "waits at %s(0x%08x) (%s:%d)", warp_op_name(f->op), f->mask, base_name(f->file), f->line);
}

// Nothing can go on: every thread waits or has returned, and no barrier or warp intrinsic can complete. Names
// a waiting thread and one that keeps it waiting.
void stuck(Sched *s, Launch *L) {
    const Fiber *f = s->f, *w = NULL, *other = NULL;
    for (int t = 0; t < s->n && !w; t++)
        if (f[t].state != DONE) w = &f[t];
    int tw = (int)(w - f);
    if (w->state == AT_WARP) {
        int w0 = tw & ~31;
        for (int j = 0; j < 32 && !other; j++) {
            const Fiber *g = &f[w0 + j];
            if ((w->mask >> j & 1) &&
                (g->state != AT_WARP || g->mask != w->mask || g->line != w->line || g->file != w->file))
                other = g;
        }
    } else {
        for (int t = 0; t < s->n && !other; t++)
            if (f[t].state != AT_BARRIER || f[t].line != w->line || f[t].file != w->file) other = &f[t];
    }
    char a[160], b[160];
    describe(w, a, sizeof a);
    describe(other ? other : w, b, sizeof b);
    fail(L, "block (%u,%u,%u): thread %d %s, but thread %d %s: not every thread %s reaches it",
         w->ids.block.x, w->ids.block.y, w->ids.block.z, tw, a, other ? (int)(other - f) : tw, b,
         w->state == AT_WARP ? "of the mask" : "of the block");
}

void run_block(Sched *s, Launch *L, uint64_t linear) {
    const dim3 g = L->grid, b = L->block;
    uint3 bid = {(unsigned)(linear % g.x), (unsigned)(linear / g.x % g.y), (unsigned)(linear / g.x / g.y)};
    s->L = L;
    s->n = L->threads;
    s->gen = 0;
    for (int t = 0; t < s->n; t++) {
        Fiber *f = &s->f[t];
        f->ids = Ids{uint3{t % b.x, t / b.x % b.y, t / b.x / b.y}, bid, b, g};
        f->wsync = 0;
        fiber_start(f);
    }
    for (;;) {
        int alive = 0;
        for (int t = 0; t < s->n && !L->failed; t++)
            if (s->f[t].state == READY) resume(s, t);
        for (int t = 0; t < s->n; t++) alive += s->f[t].state != DONE;
        if (L->failed || alive == 0) return;
        if (resolve_warps(s, L) > 0 || L->failed) continue;
        if (release_barrier(s)) continue;
        stuck(s, L);
        return;
    }
}

Fiber *self(Sched **sp) {
    Sched *s = tls;
    *sp = s;
    if (!s || !s->L) die("internal: a CUDA intrinsic called outside an emulated kernel");
    return &s->f[s->cur];
}

// ---------------------------------------------------------------------------------------------
// device memory

#ifdef EMU_ASAN
void poison(const void *p, size_t n, int on) {
    if (on) __asan_poison_memory_region(p, n);
    else __asan_unpoison_memory_region(p, n);
}
#else
void poison(const void *, size_t, int) {}
#endif

// The allocation holding [p, p + n) (n 0: p may also be its end), or allocs.end(). Caller holds mu.
std::map<uintptr_t, size_t>::iterator find_alloc(Device &d, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = d.allocs.upper_bound(a);
    if (it == d.allocs.begin()) return d.allocs.end();
    --it;
    if (a + n <= it->first + it->second && (n > 0 ? a < it->first + it->second : a <= it->first + it->second))
        return it;
    return d.allocs.end();
}

// Whether [p, p + n) overlaps any allocation. Caller holds mu.
int overlaps_device(Device &d, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = d.allocs.lower_bound(a + n);
    if (it == d.allocs.begin()) return 0;
    --it;
    return it->first + it->second > a;
}

// The allocations holding ptrs, unpoisoned (on = 0) or poisoned again (on = 1); dies naming `what` and the
// argument when one is not device memory.
void device_window(const char *what, const PtrArg *ptrs, int n, int on) {
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    for (int i = 0; i < n; i++) {
        if (!ptrs[i].p) continue;
        auto it = find_alloc(d, ptrs[i].p, 0);
        if (it == d.allocs.end())
            die("emulated device: %s: argument %d (%p) is not device memory (host memory given to the device)", what,
                ptrs[i].index, ptrs[i].p);
        poison((const void *)it->first, it->second, on);
    }
}

const char *kind_name(cudaMemcpyKind k) {
    static const char *const names[] = {"host to host", "host to device", "device to host", "device to device",
                                        "default"};
    return names[k];
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// the intrinsics (called by kernel threads)

uint64_t warp(WarpOp op, const char *file, int line, unsigned mask, uint64_t value, int arg, int width) {
    Sched *s;
    Fiber *f = self(&s);
    int t = s->cur, lane = t & 31, w0 = t & ~31;
    Launch *L = s->L;
    if (!(mask >> lane & 1))
        fail(L, "block (%u,%u,%u): thread %d calls %s (%s:%d) with mask 0x%08x, which does not name its lane %d",
             f->ids.block.x, f->ids.block.y, f->ids.block.z, t, warp_op_name(op), base_name(file), line, mask, lane);
    else if (lane_count(s, w0) < 32 && (mask >> lane_count(s, w0)) != 0)
        fail(L, "block (%u,%u,%u): %s (%s:%d) with mask 0x%08x names lanes past the block's last thread",
             f->ids.block.x, f->ids.block.y, f->ids.block.z, warp_op_name(op), base_name(file), line, mask);
    else if (width < 1 || width > 32 || (width & (width - 1)))
        fail(L, "%s (%s:%d): width %d is not a power of two up to 32", warp_op_name(op), base_name(file), line,
             width);
    f->state = AT_WARP;
    f->op = op;
    f->file = file;
    f->line = line;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
#ifdef GRPO_EMU_TSAN
    if (op == WARP_SYNC) __tsan_release(s->lane_sync[t] + (f->wsync & 1));
#endif
    yield(s, f);  // not resumed after a failure
#ifdef GRPO_EMU_TSAN
    for (int j = 0; j < 32 && op == WARP_SYNC; j++)  // every lane of the mask, before any has run on
        if (mask >> j & 1) __tsan_acquire(s->lane_sync[w0 + j] + s->lane_parity[w0 + j]);
#endif
    return f->value;
}

int barrier(BarrierOp op, const char *file, int line, int pred) {
    Sched *s;
    Fiber *f = self(&s);
    f->state = AT_BARRIER;
    f->op = op;
    f->file = file;
    f->line = line;
    f->value = (uint64_t)pred;
#ifdef GRPO_EMU_TSAN
    __tsan_release(s->bar_sync + (s->gen & 1));
#endif
    yield(s, f);
#ifdef GRPO_EMU_TSAN
    __tsan_acquire(s->bar_sync + ((s->gen - 1) & 1));
#endif
    return (int)f->value;
}

void *dynamic_shared() {
    Sched *s;
    self(&s);
    return s->smem;
}

void launch(const char *kernel, const char *file, int line, dim3 grid, dim3 block, size_t smem, ThreadFn fn,
            void *closure, const PtrArg *ptrs, int n_ptrs) {
    const char *f = base_name(file);
    uint64_t threads = (uint64_t)block.x * block.y * block.z, blocks = (uint64_t)grid.x * grid.y * grid.z;
    if (threads == 0 || threads > MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        die("emulated device: kernel %s (%s:%d): invalid launch configuration: grid (%u,%u,%u), block (%u,%u,%u) (a "
            "block holds 1 to %d threads, z up to 64; grid x up to 2^31-1, y and z up to 65535, none 0)",
            kernel, f, line, grid.x, grid.y, grid.z, block.x, block.y, block.z, MAX_THREADS);
    if (smem > MAX_DYNAMIC_SHARED)
        die("emulated device: kernel %s (%s:%d): %zu bytes of dynamic shared memory (at most %zu without "
            "cudaFuncSetAttribute)", kernel, f, line, smem, MAX_DYNAMIC_SHARED);
    char what[160];
    snprintf(what, sizeof what, "kernel %s (%s:%d)", kernel, f, line);
    device_window(what, ptrs, n_ptrs, 0);
    Launch L;
    L.kernel = kernel;
    L.file = f;
    L.line = line;
    L.grid = grid;
    L.block = block;
    L.smem = smem;
    L.fn = fn;
    L.closure = closure;
    L.threads = (int)threads;
    L.failed = 0;
#ifdef GRPO_EMU_TSAN
    __tsan_release(&L.launch_sync);
#endif
    int64_t nb = (int64_t)blocks;
    int nt = omp_get_max_threads() < nb ? omp_get_max_threads() : (int)nb;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t b = 0; b < nb; b++) {
        if (L.failed) continue;
        Sched *s = sched_of_thread();
        ensure_fibers(s, L.threads);
        if (s->smem_cap < smem) {
            free(s->smem);
            s->smem = (char *)xmalloc(smem);
            s->smem_cap = smem;
        }
        if (smem) memset(s->smem, 0xff, smem);  // what the previous block left is not this block's to read
#ifdef GRPO_EMU_TSAN
        // The blocks this host thread ran before (they used the same __shared__ memory, where a GPU gives each its
        // own) and its setup above, before this block's threads; nothing orders the threads of one block, nor
        // blocks of other host threads (the op tests run one: their races between blocks go unseen).
        s->tsan_main = __tsan_get_current_fiber();
        __tsan_acquire(&s->end_sync);
        __tsan_release(&s->start_sync);
#endif
        run_block(s, &L, (uint64_t)b);
        s->L = NULL;
    }
#ifdef GRPO_EMU_TSAN
    __tsan_acquire(&L.end_sync);
#endif
    if (L.failed) {
        char error[sizeof L.error];
        std::lock_guard<std::mutex> g(L.mu);  // written by a kernel thread
        memcpy(error, L.error, sizeof error);
        die("%s", error);
    }
    device_window(what, ptrs, n_ptrs, 1);
}

DeviceAccess::DeviceAccess(const char *what, std::initializer_list<const void *> list) : n(0) {
    flush_all_streams();  // host code on device memory: after every copy that could touch it
    PtrArg a[8];
    for (const void *q : list) {
        if (n == 8) die("internal: emu::DeviceAccess of more than 8 pointers");
        p[n] = q;
        a[n] = PtrArg{n, q};
        n++;
    }
    device_window(what, a, n, 0);
}

DeviceAccess::~DeviceAccess() {
    PtrArg a[8];
    for (int i = 0; i < n; i++) a[i] = PtrArg{i, p[i]};
    device_window("", a, n, 1);
}

}  // namespace emu

using emu::Device;
using emu::device;

// ---------------------------------------------------------------------------------------------
// the runtime API

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError() { return cudaSuccess; }  // launch errors stop the run where they happen

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int ordinal) { return ordinal == 0 ? cudaSuccess : cudaErrorInvalidDevice; }

cudaError_t cudaDriverGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}

// The emulated device's memory is the host's. Free is what a new allocation can get, MemAvailable (free memory and
// the page cache the kernel can reclaim), not sysinfo's freeram (MemFree), which a large build's page cache drives
// to nothing while 22 of 24 GiB are there for the taking.
static size_t host_available_bytes(size_t fallback) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    if (f) fclose(f);
    return found ? (size_t)kib * 1024 : fallback;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    struct sysinfo si;
    if (sysinfo(&si) != 0) return cudaErrorInvalidValue;
    *free_bytes = host_available_bytes((size_t)si.freeram * si.mem_unit);
    *total = (size_t)si.totalram * si.mem_unit;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    void *m = NULL;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return cudaErrorMemoryAllocation;  // cudaMalloc's alignment
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    d.allocs[(uintptr_t)m] = bytes ? bytes : 1;
    emu::poison(m, bytes ? bytes : 1, 1);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    emu::flush_all_streams();  // as a GPU's cudaFree waits for the device
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    auto it = d.allocs.find((uintptr_t)p);
    if (it == d.allocs.end()) die("emulated device: cudaFree(%p): not the start of a device allocation", p);
    emu::poison(p, it->second, 0);
    d.allocs.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    emu::stream_flush(s);
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    auto it = emu::find_alloc(d, p, bytes);
    if (it == d.allocs.end()) die("emulated device: cudaMemsetAsync(%p, %zu bytes): not device memory", p, bytes);
    emu::poison((void *)it->first, it->second, 0);
    memset(p, value, bytes);
    emu::poison((void *)it->first, it->second, 1);
    return cudaSuccess;
}

// A copy's checks (device sides device memory, host sides not, no overlap), then the copy when run.
static void memcpy_checked(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, int run) {
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    auto a = d.allocs.end(), b = d.allocs.end();
    if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice)
        die("emulated device: cudaMemcpyAsync: %s copies are not emulated", emu::kind_name(kind));
    int dst_dev = kind != cudaMemcpyDeviceToHost, src_dev = kind != cudaMemcpyHostToDevice;
    const char *bad = NULL;
    if (dst_dev && (a = emu::find_alloc(d, dst, bytes)) == d.allocs.end()) bad = "the destination is not device memory";
    if (src_dev && (b = emu::find_alloc(d, src, bytes)) == d.allocs.end() && !bad)
        bad = "the source is not device memory";
    if (!dst_dev && emu::overlaps_device(d, dst, bytes) && !bad) bad = "the destination is device memory";
    if (!src_dev && emu::overlaps_device(d, src, bytes) && !bad) bad = "the source is device memory";
    uintptr_t s0 = (uintptr_t)src, d0 = (uintptr_t)dst;
    if (s0 < d0 + bytes && d0 < s0 + bytes && !bad) bad = "the source and destination overlap (undefined in CUDA)";
    if (bad) die("emulated device: cudaMemcpyAsync(%p, %p, %zu bytes, %s): %s", dst, src, bytes, emu::kind_name(kind), bad);
    if (!run) return;
    if (dst_dev) emu::poison((void *)a->first, a->second, 0);
    if (src_dev) emu::poison((void *)b->first, b->second, 0);
    memcpy(dst, src, bytes);
    if (dst_dev) emu::poison((void *)a->first, a->second, 1);
    if (src_dev) emu::poison((void *)b->first, b->second, 1);
}

// A stream's copies that wait to run (from or to pinned memory), in order; issued and done count them.
struct EmuStream {
    struct Copy {
        void *dst;
        const void *src;
        size_t bytes;
        cudaMemcpyKind kind;
    };
    std::deque<Copy> pending;
    uint64_t issued = 0, done = 0, id = 0;
};

// What a record captured: its stream (by id; 0: none) and that stream's copies issued by then.
struct EmuEvent {
    uint64_t stream = 0;
    uint64_t seq = 0;
};

// Runs s's pending copies until `seq` of them have run.
static void flush_to(EmuStream *s, uint64_t seq) {
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    while (s->done < seq) {
        EmuStream::Copy c = s->pending.front();
        s->pending.pop_front();
        memcpy_checked(c.dst, c.src, c.bytes, c.kind, 1);
        s->done++;
    }
}

namespace emu {
void stream_flush(cudaStream_t s) {
    if (s) flush_to(s, s->issued);
}
}  // namespace emu

// Every stream's pending copies (what a device-wide synchronisation would wait for).
void emu::flush_all_streams() {
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    for (auto &it : d.streams) flush_to(it.second, it.second->issued);
}

// Whether [p, p + n) lies in one cudaHostAlloc'd block.
static int is_pinned(const void *p, size_t n) {
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    auto it = d.pinned.upper_bound((uintptr_t)p);
    if (it == d.pinned.begin()) return 0;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (!bytes) return cudaSuccess;
    memcpy_checked(dst, src, bytes, kind, 0);
    const void *host = kind == cudaMemcpyHostToDevice ? src : kind == cudaMemcpyDeviceToHost ? dst : NULL;
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    if (s && host && is_pinned(host, bytes)) {  // asynchronous: it waits for whatever orders it
        s->pending.push_back(EmuStream::Copy{dst, src, bytes, kind});
        s->issued++;
        return cudaSuccess;
    }
    emu::stream_flush(s);
    memcpy_checked(dst, src, bytes, kind, 1);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    *s = new EmuStream;
    (*s)->id = d.next_stream++;
    d.streams[(*s)->id] = *s;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return cudaErrorInvalidValue;
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    emu::stream_flush(s);
    d.streams.erase(s->id);
    delete s;
    return cudaSuccess;
}

// Fault injection for the tests of what a GPU fault does to grpo (grpo serve answering its requests): with
// GRPO_EMU_FAIL_SYNC=N the N-th stream synchronisation of the process reports an unspecified launch failure, as
// a kernel's fault surfaces on a GPU.
static bool injected_fault() {
    static const long at = getenv("GRPO_EMU_FAIL_SYNC") ? atol(getenv("GRPO_EMU_FAIL_SYNC")) : 0;
    static std::atomic<long> syncs{0};
    return at > 0 && ++syncs == at;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emu::stream_flush(s);
    return injected_fault() ? cudaErrorLaunchFailure : cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
    if (!e) return cudaErrorInvalidValue;
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    auto it = d.streams.find(e->stream);  // none: never recorded, on the legacy stream, or its stream destroyed
    if (it != d.streams.end()) flush_to(it->second, e->seq);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = new EmuEvent;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return cudaErrorInvalidValue;
    Device &d = device();
    std::lock_guard<std::recursive_mutex> g(d.streams_mu);
    e->stream = s ? s->id : 0;
    e->seq = s ? s->issued : 0;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned) {
    void *m = NULL;
    if (posix_memalign(&m, 4096, bytes ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    d.pinned[(uintptr_t)m] = bytes ? bytes : 1;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    emu::flush_all_streams();  // as a GPU's cudaFreeHost waits for the device
    Device &d = device();
    std::lock_guard<std::mutex> g(d.mu);
    auto it = d.pinned.find((uintptr_t)p);
    if (it == d.pinned.end()) die("emulated device: cudaFreeHost(%p): not the start of a cudaHostAlloc block", p);
    d.pinned.erase(it);
    free(p);
    return cudaSuccess;
}
