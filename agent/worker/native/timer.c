/* optagent's native timer: the clock, the timing loop and the records the parent trusts.
 *
 * The candidate shares the interpreter with the harness and can rebind any Python global
 * (a clock, a JSON module, a check) without an audit event. Here the clock
 * (CLOCK_MONOTONIC), the loop, the iteration budget, the host-speed probe, the statistics,
 * the choice of the calls the judge checks (getrandom), and, on CUDA, the device sync,
 * the L2 flush, the events and the persisting-L2 reset are C: Python only supplies the
 * kernel call and the `after` callback that runs between timed calls, outside the window
 * (its interval is timed too, and reported beside the calls' own times).
 * Each record goes straight to the parent's report pipe as one write() <= PIPE_BUF
 * (atomic), prefixed by the secret the parent gave at init, so no Python object ever
 * holds a timing the parent uses. The CUDA driver is looked up with dlopen(RTLD_NOLOAD)
 * (torch has loaded it): the same .so works on a CPU-only machine.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SECRET_BYTES 32
#define RECORD_MAX 4096 /* PIPE_BUF on Linux: one write() of this size is atomic */
#define SLOW_MIN_ITERS 5
#define WARM_S 0.05
/* the GPU's clocks ramp up over tens of ms after an idle spell: WARM_S of warm-up calls only after one this
 * long since the last loop ended. Between two cases' loops the harness loads a module and makes the inputs: 60-130
 * ms for a Triton kernel on an H100, and after 0.1 or 0.2 s idle a 13 us kernel's first calls ran at 1.00-1.08x its
 * steady time, after 0.5 s at 1.4x (bench/clock_ramp.py, docs/gpu.md 2026-12-07): at 0.1 a case paid 50 ms */
#define IDLE_S 0.25
#define PROBE_N 10000 /* ~10 us of a fixed C loop */
#define SLACK 1.3     /* host_speed.SLACK */
#define MIN_KEPT 0.2  /* host_speed.MIN_KEPT */
#define MAX_SETS 32
/* Adaptive stop: from min_iters on, every STABLE_STEP calls, the loop ends once its median moved by at
 * most STABLE_REL over the last STABLE_STEP calls (a stable GPU time needs ~30 calls, not the whole
 * budget's hundreds; each call's redraw and flush cost more than a short kernel) */
#define STABLE_STEP 10
#define STABLE_REL 0.003
#define MAX_KEEP 32
#define NO_SEED (-1LL) /* the set still holds its base inputs */

/* ------------------------------------------------------------------ CUDA driver, by dlsym */
typedef int CUresult;
typedef void *CUcontext;
typedef void *CUevent;
typedef void *CUstream;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
#define CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 38
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_LIMIT_PERSISTING_L2_CACHE_SIZE 0x06
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_UNSUPPORTED_LIMIT 215

static struct {
    CUresult (*ctx_synchronize)(void);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*device_get_attribute)(int *, int, CUdevice);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*memset_d8_async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_synchronize)(CUevent);
    CUresult (*event_elapsed_time)(float *, CUevent, CUevent);
    CUresult (*ctx_reset_persisting_l2)(void);
    CUresult (*ctx_set_limit)(int, size_t);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*module_load_data)(void **, const void *);
    CUresult (*module_get_function)(void **, void *, const char *);
    CUresult (*launch_kernel)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                              void **, void **);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
} cu;

static struct {
    int initialized, cuda, cuda_ready;
    unsigned char secret[SECRET_BYTES];
    int report_fd;
    long min_iters, max_iters, warmup;
    double budget_s, usual_probe_us, sync_us;
    double last_end; /* when the last loop ended (0: none yet) */
    long long seq, calls;
    CUdeviceptr flush;
    size_t flush_bytes;
    CUevent ev_start, ev_end;
    int sm_count;
    void *digest_fn;       /* the digest kernel (digest_ptx.h), loaded at its first use */
    CUdeviceptr digest_sums; /* its two 64-bit sums */
    int ref_answers, ref_questions, ref_set; /* the referee's pipes, worker side (referee()), or ref_set 0 */
    int usual_set;                           /* machine_usual() called: once, before any candidate code */
} S;

static int cu_fail(CUresult r, const char *what) {
    const char *name = NULL;
    if (cu.get_error_name == NULL || cu.get_error_name(r, &name) != 0 || name == NULL)
        name = "unknown CUDA error";
    PyErr_Format(PyExc_RuntimeError, "optagent timer: %s failed: %s (%d)", what, name, r);
    return -1;
}

#define CU(call, what) do { CUresult r_ = (call); if (r_ != 0) return cu_fail(r_, what); } while (0)

static int cuda_setup(void) {
    if (S.cuda_ready)
        return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_NOW);
    if (lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: libcuda.so.1 is not loaded in this process");
        return -1;
    }
#define SYM(field, name) do { *(void **)(&cu.field) = dlsym(lib, name); if (cu.field == NULL) { \
        PyErr_Format(PyExc_RuntimeError, "optagent timer: libcuda.so.1 has no %s", name); return -1; } } while (0)
    SYM(get_error_name, "cuGetErrorName");
    SYM(ctx_synchronize, "cuCtxSynchronize");
    SYM(ctx_get_current, "cuCtxGetCurrent");
    SYM(ctx_get_device, "cuCtxGetDevice");
    SYM(device_get_attribute, "cuDeviceGetAttribute");
    SYM(mem_alloc, "cuMemAlloc_v2");
    SYM(memset_d8_async, "cuMemsetD8Async");
    SYM(event_create, "cuEventCreate");
    SYM(event_record, "cuEventRecord");
    SYM(event_synchronize, "cuEventSynchronize");
    SYM(event_elapsed_time, "cuEventElapsedTime");
    SYM(ctx_reset_persisting_l2, "cuCtxResetPersistingL2Cache");
    SYM(ctx_set_limit, "cuCtxSetLimit");
    SYM(module_load_data, "cuModuleLoadData");
    SYM(module_get_function, "cuModuleGetFunction");
    SYM(launch_kernel, "cuLaunchKernel");
    SYM(memcpy_dtoh, "cuMemcpyDtoH_v2");
#undef SYM
    CUcontext ctx = NULL;
    CU(cu.ctx_get_current(&ctx), "cuCtxGetCurrent");
    if (ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: no current CUDA context (torch has not initialised CUDA)");
        return -1;
    }
    CUdevice dev;
    int l2 = 0;
    CU(cu.ctx_get_device(&dev), "cuCtxGetDevice");
    CU(cu.device_get_attribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev), "cuDeviceGetAttribute(L2)");
    CU(cu.device_get_attribute(&S.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute(SMs)");
    size_t bytes = 4 * (size_t)(l2 > 0 ? l2 : 64 << 20);
    S.flush_bytes = bytes > ((size_t)256 << 20) ? bytes : ((size_t)256 << 20);
    CU(cu.mem_alloc(&S.flush, S.flush_bytes), "cuMemAlloc (L2 flush buffer)");
    CU(cu.event_create(&S.ev_start, 0), "cuEventCreate");
    CU(cu.event_create(&S.ev_end, 0), "cuEventCreate");
    S.cuda_ready = 1;
    return 0;
}

/* ------------------------------------------------------------------ clock, probe, randomness */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double probe_us(void) {
    volatile uint64_t acc = 0;
    double t0 = now_s();
    for (uint64_t i = 0; i < PROBE_N; i++)
        acc += i * 2654435761u;
    return (now_s() - t0) * 1e6;
}

static int random_bytes(void *buf, size_t n) {
    unsigned char *p = buf;
    while (n > 0) {
        long got = syscall(SYS_getrandom, p, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static int random_u64(uint64_t *out) { return random_bytes(out, sizeof *out); }

static int sync_device(void) {
    if (S.cuda)
        CU(cu.ctx_synchronize(), "cuCtxSynchronize");
    return 0;
}

static int flush_l2(void) {
    if (S.cuda)
        CU(cu.memset_d8_async(S.flush, 0, S.flush_bytes, NULL), "cuMemsetD8Async (L2 flush)");
    return 0;
}

/* ------------------------------------------------------------------ the referee's marks (worker side)
 * Under a referee (evaluation/referee.py) each timed call is bracketed: "T" just before the call, "D" just
 * after its sync, each answered "G" by the referee's clock at once, so the clock's window from T's answer to
 * D covers the call alone, apart from the harness's redraw, flush and digest between calls. The answer is
 * awaited spinning (SPIN_S, then blocking): a wake-up from a blocking read would land inside the window. */
#define SPIN_S 0.005

static int ref_mark(char what) {
    if (!S.ref_set)
        return 0;
    char line[2] = {what, '\n'}, ans[8];
    if (write(S.ref_questions, line, 2) != 2)
        goto gone;
    struct pollfd p = {S.ref_answers, POLLIN, 0};
    double t0 = now_s();
    for (;;) {
        int spin = now_s() - t0 < SPIN_S;
        int r = poll(&p, 1, spin ? 0 : -1);
        if (r > 0)
            break;
        if (r < 0 && errno != EINTR)
            goto gone;
    }
    size_t n = 0;
    while (n == 0 || ans[n - 1] != '\n') {
        ssize_t k = read(S.ref_answers, ans + n, 1); /* one byte at a time: never the next answer's */
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0 || ++n == sizeof ans)
            goto gone;
    }
    if (n == 2 && ans[0] == 'G')
        return 0;
gone:
    PyErr_SetString(PyExc_RuntimeError, "the referee stopped answering the harness");
    return -1;
}

static int reset_persisting_l2(void) {
    if (!S.cuda)
        return 0;
    /* GPUs without a persisting L2 (before Ampere) say so: nothing to reset there */
    CUresult r = cu.ctx_reset_persisting_l2();
    if (r != 0 && r != CUDA_ERROR_NOT_SUPPORTED)
        return cu_fail(r, "cuCtxResetPersistingL2Cache");
    r = cu.ctx_set_limit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0);
    if (r != 0 && r != CUDA_ERROR_NOT_SUPPORTED && r != CUDA_ERROR_UNSUPPORTED_LIMIT)
        return cu_fail(r, "cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)");
    return 0;
}

/* ------------------------------------------------------------------ records */
static int emit(const char *json) {
    char line[RECORD_MAX];
    int at = 0;
    for (int i = 0; i < SECRET_BYTES; i++)
        at += snprintf(line + at, sizeof line - at, "%02x", S.secret[i]);
    int n = snprintf(line + at, sizeof line - at, " %s\n", json);
    if (n < 0 || at + n >= (int)sizeof line) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: record over PIPE_BUF");
        return -1;
    }
    ssize_t w;
    do {
        w = write(S.report_fd, line, (size_t)(at + n));
    } while (w < 0 && errno == EINTR);
    if (w != at + n) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: the report pipe refused a record");
        return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* statistics.median and statistics.quantiles(n=10) (method 'exclusive'), floored at 1e-3 */
static void stats(double *s, long n, double *median, double *p10, double *p90) {
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    *median = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    if (n < 2) {
        *p10 = *p90 = s[0];
    } else {
        long m = n + 1;
        double q[2];
        int which[2] = {1, 9};
        for (int k = 0; k < 2; k++) {
            long j = which[k] * m / 10;
            j = j < 1 ? 1 : (j > n - 1 ? n - 1 : j);
            long delta = which[k] * m - j * 10;
            /* within the samples: with few of them the exclusive method extrapolates past the ends (3
             * samples: p10 = 1.6 x the least - 0.6 x the next, below zero for a spread-out loop) */
            delta = delta < 0 ? 0 : (delta > 10 ? 10 : delta);
            q[k] = (s[j - 1] * (10 - delta) + s[j] * delta) / 10;
        }
        *p10 = q[0];
        *p90 = q[1];
    }
    *median = fmax(*median, 1e-3);
    *p10 = fmax(*p10, 1e-3);
    *p90 = fmax(*p90, 1e-3);
}

/* ------------------------------------------------------------------ a case's session */
typedef struct { long long call; int set; long long seed; } Call;

typedef struct {
    PyObject_HEAD
    char label[104];
    int n_sets, n_keep;
    long long seeds[MAX_SETS]; /* the refresh seed each set's inputs were last drawn from */
} Session;

static double median_of(const double *x, long n, double *tmp) {
    memcpy(tmp, x, (size_t)n * sizeof(double));
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

/* the median of the first i samples within STABLE_REL of that of the first i - STABLE_STEP */
static int stable(const double *samples, long i, double *tmp) {
    if (samples == NULL || tmp == NULL || i < S.min_iters || i < 2 * STABLE_STEP || i % STABLE_STEP != 0)
        return 0;
    double before = median_of(samples, i - STABLE_STEP, tmp), now = median_of(samples, i, tmp);
    return fabs(now - before) <= STABLE_REL * now;
}

static int more(long i, double start, const double *samples, double *tmp) {
    if (i >= S.max_iters)
        return 0;
    double spent = now_s() - start;
    if (i < (SLOW_MIN_ITERS < S.min_iters ? SLOW_MIN_ITERS : S.min_iters))
        return 1;
    if (stable(samples, i, tmp))
        return 0;
    return spent < (i < S.min_iters ? 4 * S.budget_s : S.budget_s);
}

typedef struct {
    double *samples, *probes, *afters; /* afters: each timed call's `after`, up to a device sync */
    double *tmp;                       /* the adaptive stop's sorted copy */
    Call kept[MAX_KEEP], last[MAX_SETS];
    int n_kept;
    long n, seen, n_after;
    double loop_s;
} Loop;

/* after the call: keep it (reservoir over all timed calls), tell `after`, redraw the set's seed */
static int after_call(Session *self, Loop *L, PyObject *after, int set) {
    Call c = {++S.calls, set, self->seeds[set]};
    L->last[set] = c;
    L->seen++;
    int keep = 0;
    long long drop = -1;
    if (L->n_kept < self->n_keep) {
        L->kept[L->n_kept++] = c;
        keep = 1;
    } else {
        uint64_t r;
        if (random_u64(&r) < 0)
            return -1;
        if ((double)(r >> 11) * 0x1.0p-53 < (double)self->n_keep / (double)L->seen) {
            int j = (int)((r & 0x7ff) % (uint64_t)self->n_keep);
            drop = L->kept[j].call;
            L->kept[j] = c;
            keep = 1;
        }
    }
    if (after == NULL)
        return 0;
    uint64_t r;
    if (random_u64(&r) < 0)
        return -1;
    long long seed = (long long)(r & ((1ULL << 40) - 1));
    /* `after` is Python the candidate can reach (it shares the interpreter): work it moved there
     * falls outside the timed window, so the interval is timed here, GPU work included, and the
     * parent compares it with the same after-work in the baseline's loop (timer_check.py). */
    double a0 = now_s();
    PyObject *res = PyObject_CallFunction(after, "LiLOL", c.call, set, seed, keep ? Py_True : Py_False, drop);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    if (sync_device() < 0)
        return -1;
    L->afters[L->n_after++] = (now_s() - a0) * 1e6;
    self->seeds[set] = seed;
    return 0;
}

static void json_call(char *buf, size_t cap, size_t *at, Call c) {
    char seed[32];
    if (c.seed == NO_SEED)
        snprintf(seed, sizeof seed, "null");
    else
        snprintf(seed, sizeof seed, "%lld", c.seed);
    *at += snprintf(buf + *at, *at < cap ? cap - *at : 0, "%s[%lld,%d,%s]", buf[*at - 1] == '[' ? "" : ",",
                    c.call, c.set, seed);
}

/* the end record, and the same facts for the harness (it saves the outputs of `check`) */
static PyObject *finish(Session *self, Loop *L, const char *kind, int host_conditioned) {
    long n = L->n, used = n;
    int slow = 0;
    if (host_conditioned && n > 0) {
        double ref = S.usual_probe_us;
        for (long i = 0; i < n; i++)
            ref = fmin(ref, L->probes[i]);
        S.usual_probe_us = ref;
        long k = 0;
        for (long i = 0; i < n; i++)
            if (L->probes[i] <= SLACK * ref)
                L->probes[k++] = L->samples[i]; /* probes reused as the kept samples */
        if (k >= 3 && k >= MIN_KEPT * n) {
            memcpy(L->samples, L->probes, (size_t)k * sizeof(double));
            used = k;
        } else {
            slow = 1;
        }
    }
    if (n == 0) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: no timed call");
        return NULL;
    }
    double med, p10, p90, after_p10 = 0, unused_med, unused90;
    stats(L->samples, used, &med, &p10, &p90);
    /* the low decile: work moved into `after` is there at every call, a busy host's slow spells are not */
    if (L->n_after > 0)
        stats(L->afters, L->n_after, &unused_med, &after_p10, &unused90);
    Call check[MAX_KEEP + MAX_SETS];
    int nc = 0;
    for (int i = 0; i < L->n_kept; i++)
        check[nc++] = L->kept[i];
    for (int s = 0; s < self->n_sets; s++) {
        int dup = L->last[s].call < 0;
        for (int i = 0; i < nc && !dup; i++)
            dup = check[i].call == L->last[s].call;
        if (!dup)
            check[nc++] = L->last[s];
    }
    char json[RECORD_MAX];
    size_t at = (size_t)snprintf(json, sizeof json,
        "{\"type\":\"end\",\"seq\":%lld,\"case\":\"%s\",\"kind\":\"%s\",\"median_us\":%.9g,\"p10_us\":%.9g,"
        "\"p90_us\":%.9g,\"samples\":%ld,\"calls\":%ld,\"host_slow\":%s,\"slow_host_calls\":%ld,\"loop_s\":%.9g,"
        "\"after_us\":%.9g,\"n_keep\":%d,\"check\":[", ++S.seq, self->label, kind, med, p10, p90, used, n,
        slow ? "true" : "false", n - used, L->loop_s, after_p10, self->n_keep);
    for (int i = 0; i < nc; i++)
        json_call(json, sizeof json, &at, check[i]);
    at += snprintf(json + at, at < sizeof json ? sizeof json - at : 0, "]}");
    if (at >= sizeof json) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: record over PIPE_BUF");
        return NULL;
    }
    if (emit(json) < 0)
        return NULL;
    PyObject *calls = PyList_New(nc);
    if (calls == NULL)
        return NULL;
    for (int i = 0; i < nc; i++) {
        PyObject *seed = check[i].seed == NO_SEED ? Py_NewRef(Py_None) : PyLong_FromLongLong(check[i].seed);
        PyList_SET_ITEM(calls, i, Py_BuildValue("(LiN)", check[i].call, check[i].set, seed));
    }
    return Py_BuildValue("{s:d,s:d,s:d,s:l,s:O,s:l,s:d,s:N}", "median_us", med, "p10_us", p10, "p90_us", p90,
                         "samples", used, "host_slow", slow ? Py_True : Py_False, "slow_host_calls", n - used,
                         "after_us", after_p10, "check", calls);
}

static int start_loop(Session *self, Loop *L, const char *kind) {
    memset(L, 0, sizeof *L);
    for (int s = 0; s < MAX_SETS; s++)
        L->last[s].call = -1;
    if (!S.initialized) {
        PyErr_SetString(PyExc_RuntimeError, "optagent timer: init() was not called");
        return -1;
    }
    if (S.cuda && cuda_setup() < 0)
        return -1;
    L->samples = PyMem_Calloc((size_t)S.max_iters, sizeof(double));
    L->probes = PyMem_Calloc((size_t)S.max_iters, sizeof(double));
    L->afters = PyMem_Calloc((size_t)S.max_iters, sizeof(double));
    L->tmp = PyMem_Calloc((size_t)S.max_iters, sizeof(double));
    if (L->samples == NULL || L->probes == NULL || L->afters == NULL || L->tmp == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    char json[256];
    snprintf(json, sizeof json, "{\"type\":\"start\",\"seq\":%lld,\"case\":\"%s\",\"kind\":\"%s\"}", ++S.seq,
             self->label, kind);
    if (emit(json) < 0 || reset_persisting_l2() < 0)
        return -1;
    return 0;
}

static void free_loop(Loop *L) {
    PyMem_Free(L->samples);
    PyMem_Free(L->probes);
    PyMem_Free(L->afters);
    PyMem_Free(L->tmp);
}

/* Session.eager(kind, fn, arg_sets, after): wall time of fn(*set) up to a device-wide sync */
static PyObject *session_eager(Session *self, PyObject *args) {
    const char *kind;
    PyObject *fn, *sets, *after, *tuples = NULL, *result = NULL;
    if (!PyArg_ParseTuple(args, "sOOO", &kind, &fn, &sets, &after))
        return NULL;
    if (strcmp(kind, "eager") != 0 && strcmp(kind, "baseline") != 0)
        return PyErr_Format(PyExc_ValueError, "kind must be 'eager' or 'baseline', not %s", kind);
    if (!PySequence_Check(sets) || PySequence_Size(sets) != self->n_sets)
        return PyErr_Format(PyExc_ValueError, "arg_sets must be a sequence of %d argument lists", self->n_sets);
    after = after == Py_None ? NULL : after;
    tuples = PyTuple_New(self->n_sets);
    if (tuples == NULL)
        return NULL;
    for (int s = 0; s < self->n_sets; s++) {
        PyObject *item = PySequence_GetItem(sets, s), *t = item ? PySequence_Tuple(item) : NULL;
        Py_XDECREF(item);
        if (t == NULL) {
            Py_DECREF(tuples);
            return NULL;
        }
        PyTuple_SET_ITEM(tuples, s, t);
    }
    Loop L;
    if (start_loop(self, &L, kind) < 0)
        goto out;
    int n = self->n_sets;
    double t0 = now_s(), loop_t0 = t0;
    /* warm-up: at least `warmup` calls, and WARM_S seconds on a GPU that was idle (its clocks ramp up) */
    double warm_s = (S.cuda && (S.last_end == 0 || t0 - S.last_end > IDLE_S)) ? WARM_S : 0;
    for (long i = 0; i < S.warmup || now_s() - t0 < warm_s; i++) {
        if (i >= 2 && now_s() - t0 > S.budget_s)
            break; /* a slow kernel is warm after two calls */
        PyObject *r = PyObject_Call(fn, PyTuple_GET_ITEM(tuples, i % n), NULL);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        if (after != NULL) { /* a warm-up answer left in the output must not pass as a timed one */
            uint64_t rnd;
            if (sync_device() < 0 || random_u64(&rnd) < 0)
                goto out;
            long long seed = (long long)(rnd & ((1ULL << 40) - 1));
            r = PyObject_CallFunction(after, "LiLOL", (long long)(-1 - i), (int)(i % n), seed, Py_False, -1LL);
            if (r == NULL)
                goto out;
            Py_DECREF(r);
            self->seeds[i % n] = seed;
        }
    }
    if (sync_device() < 0)
        goto out;
    int host = S.cuda; /* GPU timings only: a CPU-interpreter time is a label */
    double start = now_s();
    for (long i = 0; more(i, start, L.samples, L.tmp); i++) {
        int set = (int)(i % n);
        if (flush_l2() < 0 || sync_device() < 0)
            goto out;
        if (host)
            L.probes[i] = probe_us();
        if (after != NULL && ref_mark('T') < 0) /* a refereed loop always has its after-work */
            goto out;
        double c0 = now_s();
        PyObject *r = PyObject_Call(fn, PyTuple_GET_ITEM(tuples, set), NULL);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        if (sync_device() < 0)
            goto out;
        double us = (now_s() - c0) * 1e6;
        if (after != NULL && ref_mark('D') < 0)
            goto out;
        L.samples[i] = S.cuda ? fmax(us - S.sync_us, 0.5) : us;
        L.n = i + 1;
        if (after_call(self, &L, after, set) < 0)
            goto out;
    }
    L.loop_s = now_s() - loop_t0;
    S.last_end = now_s();
    result = finish(self, &L, kind, host);
out:
    free_loop(&L);
    Py_DECREF(tuples);
    return result;
}

/* Session.replay(launch, after): GPU time of launch(i) between two events on the legacy default
 * stream (a graph replay, or the call itself); replays get `after` like eager calls */
static PyObject *session_replay(Session *self, PyObject *args) {
    PyObject *launch, *after, *result = NULL;
    if (!PyArg_ParseTuple(args, "OO", &launch, &after))
        return NULL;
    if (!S.cuda)
        return PyErr_Format(PyExc_RuntimeError, "optagent timer: replay() needs a GPU");
    after = after == Py_None ? NULL : after;
    Loop L;
    if (start_loop(self, &L, "gpu") < 0)
        goto out;
    double start = now_s();
    for (long i = 0; more(i, start, L.samples, L.tmp); i++) {
        int set = (int)(i % self->n_sets);
        float ms = 0;
        if (sync_device() < 0 || flush_l2() < 0)
            goto out;
        /* no sync between the flush and the start event: host-side launch latency stays out */
        CUresult e = cu.event_record(S.ev_start, NULL);
        if (e != 0) { cu_fail(e, "cuEventRecord"); goto out; }
        PyObject *r = PyObject_CallFunction(launch, "l", i);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
        if ((e = cu.event_record(S.ev_end, NULL)) != 0) { cu_fail(e, "cuEventRecord"); goto out; }
        if ((e = cu.event_synchronize(S.ev_end)) != 0) { cu_fail(e, "cuEventSynchronize"); goto out; }
        if (sync_device() < 0)
            goto out;
        if ((e = cu.event_elapsed_time(&ms, S.ev_start, S.ev_end)) != 0) { cu_fail(e, "cuEventElapsedTime"); goto out; }
        L.samples[i] = (double)ms * 1e3;
        L.n = i + 1;
        if (after_call(self, &L, after, set) < 0)
            goto out;
    }
    L.loop_s = now_s() - start;
    S.last_end = now_s();
    result = finish(self, &L, "gpu", 0);
out:
    free_loop(&L);
    return result;
}

static PyMethodDef session_methods[] = {
    {"eager", (PyCFunction)session_eager, METH_VARARGS, "eager(kind, fn, arg_sets, after) -> stats"},
    {"replay", (PyCFunction)session_replay, METH_VARARGS, "replay(launch, after) -> stats"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot session_slots[] = {
    {Py_tp_methods, session_methods},
    {Py_tp_doc, "One case's timing: the refresh seed of every input set, across its loops."},
    {0, NULL},
};

static PyType_Spec session_spec = {"_optagent_timer.Session", sizeof(Session), 0,
                                    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, session_slots};
static PyObject *SessionType;

/* ------------------------------------------------------------------ the outputs' digest (worker/digests.py)
 * digest(ptr, n_words) -> (sum0, sum1): the digest's two sums over n_words 8-byte words at a device address, in one
 * pass (digest.cu), on the legacy default stream, read back when done. What the harness tells the referee between
 * two timed calls; the judge computes the same sums with torch over its saved copy. Like everything in this
 * process it is no defence: a digest that lies is caught by the judge, not here. */
#include "digest_ptx.h"
#define DIGEST_BLOCK 256

static PyObject *timer_digest(PyObject *mod, PyObject *args) {
    unsigned long long ptr, n;
    if (!PyArg_ParseTuple(args, "KK", &ptr, &n))
        return NULL;
    if (!S.cuda_ready)
        return PyErr_Format(PyExc_RuntimeError, "optagent timer: digest() before cuda_setup()");
    if (S.digest_fn == NULL) {
        void *module = NULL;
        CUresult r = cu.module_load_data(&module, DIGEST_PTX);
        if (r != 0) { cu_fail(r, "cuModuleLoadData (the digest kernel)"); return NULL; }
        if ((r = cu.module_get_function(&S.digest_fn, module, "optagent_digest")) != 0) {
            cu_fail(r, "cuModuleGetFunction (the digest kernel)");
            return NULL;
        }
        if ((r = cu.mem_alloc(&S.digest_sums, 16)) != 0) { S.digest_fn = NULL; cu_fail(r, "cuMemAlloc"); return NULL; }
    }
    unsigned long long sums[2] = {0, 0};
    CUresult r = cu.memset_d8_async(S.digest_sums, 0, 16, NULL);
    if (r != 0) { cu_fail(r, "cuMemsetD8Async (digest)"); return NULL; }
    if (n > 0) {
        unsigned long long blocks = (n + DIGEST_BLOCK - 1) / DIGEST_BLOCK, most = 8ULL * (S.sm_count > 0 ? S.sm_count : 132);
        unsigned grid = (unsigned)(blocks < most ? blocks : most);
        CUdeviceptr words = (CUdeviceptr)ptr, out = S.digest_sums;
        void *params[] = {&words, &n, &out};
        r = cu.launch_kernel(S.digest_fn, grid, 1, 1, DIGEST_BLOCK, 1, 1, 0, NULL, params, NULL);
        if (r != 0) { cu_fail(r, "cuLaunchKernel (digest)"); return NULL; }
    }
    if ((r = cu.memcpy_dtoh(sums, S.digest_sums, 16)) != 0) { cu_fail(r, "cuMemcpyDtoH (digest)"); return NULL; }
    return Py_BuildValue("KK", sums[0], sums[1]);
}

/* ------------------------------------------------------------------ module functions */
static PyObject *timer_init(PyObject *mod, PyObject *args) {
    int secret_fd, report_fd, cuda;
    long min_iters, max_iters, warmup;
    double budget_s;
    if (!PyArg_ParseTuple(args, "iipllld", &secret_fd, &report_fd, &cuda, &min_iters, &max_iters, &warmup, &budget_s))
        return NULL;
    if (S.initialized)
        return PyErr_Format(PyExc_RuntimeError, "optagent timer: init() was already called");
    if (min_iters < 1 || max_iters < min_iters || warmup < 0 || !(budget_s >= 0))
        return PyErr_Format(PyExc_ValueError, "optagent timer: bad iteration budget");
    S.initialized = 1; /* one-shot even when it fails below: a second call is never the harness's */
    size_t got = 0;
    while (got < SECRET_BYTES) {
        ssize_t r = read(secret_fd, S.secret + got, SECRET_BYTES - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            close(secret_fd);
            return PyErr_Format(PyExc_RuntimeError, "optagent timer: could not read the secret");
        }
        got += (size_t)r;
    }
    close(secret_fd);
    S.report_fd = report_fd;
    S.cuda = cuda;
    S.min_iters = min_iters;
    S.max_iters = max_iters;
    S.warmup = warmup;
    S.budget_s = budget_s;
    S.usual_probe_us = INFINITY;
    for (int i = 0; i < 200; i++)
        S.usual_probe_us = fmin(S.usual_probe_us, probe_us());
    Py_RETURN_NONE;
}

static PyObject *timer_cuda_setup(PyObject *mod, PyObject *noargs) {
    if (!S.initialized || !S.cuda)
        return PyErr_Format(PyExc_RuntimeError, "optagent timer: not initialised for CUDA");
    if (S.cuda_ready)
        Py_RETURN_NONE;
    if (cuda_setup() < 0)
        return NULL;
    double t[50];
    for (int i = 0; i < 50; i++) {
        if (sync_device() < 0)
            return NULL;
        double t0 = now_s();
        if (sync_device() < 0)
            return NULL;
        t[i] = (now_s() - t0) * 1e6;
    }
    qsort(t, 50, sizeof *t, cmp_double);
    S.sync_us = (t[24] + t[25]) / 2;
    Py_RETURN_NONE;
}

static PyObject *timer_session(PyObject *mod, PyObject *args) {
    const char *label;
    int n_sets, n_keep;
    if (!PyArg_ParseTuple(args, "sii", &label, &n_sets, &n_keep))
        return NULL;
    size_t len = strlen(label);
    if (len == 0 || len >= 100)
        return PyErr_Format(PyExc_ValueError, "case label must be 1-99 characters");
    for (size_t i = 0; i < len; i++)
        if (label[i] < 0x20 || label[i] > 0x7e || label[i] == '"' || label[i] == '\\')
            return PyErr_Format(PyExc_ValueError, "case label must be printable ASCII without quotes");
    if (n_sets < 1 || n_sets > MAX_SETS || n_keep < 0 || n_keep > MAX_KEEP)
        return PyErr_Format(PyExc_ValueError, "1-%d input sets and 0-%d kept calls", MAX_SETS, MAX_KEEP);
    Session *self = PyObject_New(Session, (PyTypeObject *)SessionType);
    if (self == NULL)
        return NULL;
    memcpy(self->label, label, len + 1);
    self->n_sets = n_sets;
    self->n_keep = n_keep;
    for (int s = 0; s < MAX_SETS; s++)
        self->seeds[s] = NO_SEED;
    return (PyObject *)self;
}

static PyObject *timer_wait_for_usual(PyObject *mod, PyObject *args) {
    double max_s;
    if (!PyArg_ParseTuple(args, "d", &max_s))
        return NULL;
    double end = now_s() + max_s;
    for (;;) {
        double best = fmin(probe_us(), fmin(probe_us(), probe_us()));
        if (best <= SLACK * S.usual_probe_us)
            Py_RETURN_TRUE;
        if (now_s() >= end)
            Py_RETURN_FALSE;
        struct timespec ts = {0, 20 * 1000 * 1000};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
}

static PyObject *timer_referee(PyObject *mod, PyObject *args) {
    int answers, questions;
    if (!PyArg_ParseTuple(args, "ii", &answers, &questions))
        return NULL;
    if (S.ref_set) /* once, before any candidate code: a second call is never the harness's */
        return PyErr_Format(PyExc_RuntimeError, "optagent timer: the referee's pipes are already set");
    S.ref_answers = answers;
    S.ref_questions = questions;
    S.ref_set = 1;
    Py_RETURN_NONE;
}

static PyObject *timer_usual_probe_us(PyObject *mod, PyObject *noargs) { return PyFloat_FromDouble(S.usual_probe_us); }

/* machine_usual(us): the machine's usual probe, on record from trusted workers' earlier processes
 * (host_speed.usual_probe_us): a process that runs slow from its start then sees its loops as slow ones, where
 * its own fastest probe would call that speed usual. Only lowers the reference; once, before any candidate code. */
static PyObject *timer_machine_usual(PyObject *mod, PyObject *args) {
    double us;
    if (!PyArg_ParseTuple(args, "d", &us))
        return NULL;
    if (S.usual_set)
        return PyErr_Format(PyExc_RuntimeError, "optagent timer: the machine's usual probe is already set");
    S.usual_set = 1;
    if (us > 0 && isfinite(us))
        S.usual_probe_us = fmin(S.usual_probe_us, us);
    Py_RETURN_NONE;
}

static PyMethodDef timer_methods[] = {
    {"init", timer_init, METH_VARARGS,
     "init(secret_fd, report_fd, cuda, min_iters, max_iters, warmup, budget_s): once, before any candidate code"},
    {"cuda_setup", timer_cuda_setup, METH_NOARGS, "look up the driver, allocate the L2 flush buffer"},
    {"session", timer_session, METH_VARARGS, "session(case_label, n_sets, n_keep) -> Session"},
    {"wait_for_usual", timer_wait_for_usual, METH_VARARGS, "wait_for_usual(max_s) -> bool"},
    {"referee", timer_referee, METH_VARARGS, "referee(answers_fd, questions_fd): mark each timed call to it"},
    {"usual_probe_us", timer_usual_probe_us, METH_NOARGS, "the fastest host probe seen"},
    {"machine_usual", timer_machine_usual, METH_VARARGS, "machine_usual(us): the machine's usual probe, once"},
    {"digest", timer_digest, METH_VARARGS, "digest(ptr, n_words) -> (sum0, sum1): the outputs' digest sums"},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------ the referee's clock (parent side)
 * Not the worker's: the trusted parent loads its own build of this file with ctypes and runs
 * optagent_referee_clock in a thread of its own (evaluation/referee.py), without Python's lock (ctypes
 * drops it for the call). It relays the worker's questions to the referee's thread, each line prefixed
 * with its window in microseconds, and the referee's answers back. A window runs from the moment an
 * answer was written to the moment the next question was read, by CLOCK_MONOTONIC: a thread of a busy
 * Python process would add its own wait for the interpreter's lock to both ends, a jitter of up to
 * milliseconds beside GPU calls of tens of microseconds. It closes the four descriptors when either side
 * ends; a line longer than any question is passed on as "X", which the referee refuses. A timed call's marks
 * ("T", "D": ref_mark above) it answers itself ("G"), passing them on stamped, so the call's window holds no
 * Python; after a "T" it waits for the "D" spinning for up to spin_s (then blocking): its own wake-up from a
 * blocking read would land in the window. An answer is stamped before it is written: the worker it wakes may take
 * this thread's core at once, and a stamp taken after would lose what the worker did meanwhile (a 5 ms call read
 * 0.5 us on one core: tests/test_referee.py), where a late stamp only lengthens a window.
 *
 * A timed call's "R" it answers too, where the question is the harness's own in its turn (after that call's "D",
 * its number the next, set 0, a digest of 64 hex digits; anything else goes to the thread, which refuses it):
 * the seed drawn here and the reservoir's keep and drop by referee.py's rule (_reservoir, the same bounds); and a
 * warm-up call's "W 0" between timed calls ("S <seed> 0 -1"). The
 * thread is told "<window>:<seed>:<keep>:<drop> R ..." (its stamp is this clock's alone: no worker's line can
 * put a colon there), checks the turn as for any question and files the kept call, and answers nothing. Why
 * here: the thread answers under the parent's Python lock, and a busy parent (another lane, a planner) held
 * each answer by up to its switch interval: 5 ms a round trip with a Python thread spinning in the parent, 80-90
 * us without, against 13-16 us either way from here (bench/referee_answer.py on a CPU machine, docs/gpu.md
 * 2026-12-07, fourth session). The thread, having refused
 * an earlier line, closes its answers: the next "R" here finds them closed and the relay ends. */
#define REF_MIN_KEEP 2 /* referee.py MIN_KEEP; MAX_KEEP above is its MAX_KEEP */
typedef struct {
    int open;             /* its "B" answered "G" by the thread, its "E" not yet */
    int baseline, target; /* a baseline loop keeps no call; others up to target */
    char expect;          /* the next of a timed call's T, D, R (referee.py RefereeLoop.expect) */
    long calls, seen, kept[MAX_KEEP];
    int n_kept;
} ClockLoop;

/* "B <label> <kind> <n_sets> <n_keep>": the loop it opens, once the thread answers "G" (open 0: not parsed) */
static ClockLoop clock_heard_b(const char *q, size_t len) {
    ClockLoop L = {0};
    char line[300], label[80], kind[16];
    int n_sets = 0, n_keep = 0;
    if (len >= sizeof line)
        return L;
    memcpy(line, q, len);
    line[len] = 0;
    L.open = sscanf(line, "B %79s %15s %d %d", label, kind, &n_sets, &n_keep) == 4;
    L.baseline = L.open && strcmp(kind, "baseline") == 0;
    L.target = n_keep < REF_MIN_KEEP ? REF_MIN_KEEP : n_keep > MAX_KEEP ? MAX_KEEP : n_keep;
    L.expect = 'T';
    return L;
}

/* the call number of a well-formed "R <call> 0 <digest>\n", or -1 */
static long clock_r_call(const char *q, size_t len) {
    size_t i = 2;
    long call = 0;
    if (len < 2 + 1 + 3 + 64 + 1 || q[0] != 'R' || q[1] != ' ')
        return -1;
    for (; i < len && q[i] >= '0' && q[i] <= '9' && i < 9; i++)
        call = call * 10 + (q[i] - '0');
    if (i == 2 || len != i + 3 + 64 + 1 || memcmp(q + i, " 0 ", 3) != 0)
        return -1;
    for (size_t j = i + 3; j < len - 1; j++)
        if (!((q[j] >= '0' && q[j] <= '9') || (q[j] >= 'a' && q[j] <= 'f')))
            return -1;
    return call;
}

/* the reservoir's step for a kept call (referee.py _reservoir): 1 if kept, *drop the call let go (or -1) */
static int clock_reservoir(ClockLoop *L, long call, long *drop) {
    uint64_t r = 0;
    *drop = -1;
    if (L->baseline)
        return 0;
    L->seen++;
    if (L->n_kept < L->target) {
        L->kept[L->n_kept++] = call;
        return 1;
    }
    if (random_u64(&r) < 0 || (double)(r >> 11) / 9007199254740992.0 >= (double)L->target / (double)L->seen)
        return 0;
    if (random_u64(&r) < 0)
        return 0;
    int at = (int)(r % (uint64_t)L->n_kept);
    *drop = L->kept[at];
    L->kept[at] = call;
    return 1;
}

/* the thread has closed its answers (it refused a question): nothing more is answered here */
static int thread_gone(int from_referee) {
    struct pollfd p = {from_referee, POLLIN, 0};
    return poll(&p, 1, 0) != 0;
}

static int relay_write(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

int optagent_referee_clock(int from_worker, int to_worker, int to_referee, int from_referee, double spin_s) {
    char q[512], a[256], head[96];
    size_t qn = 0;
    double answered = now_s();
    int spin = 0; /* a "T" or a "D" answered: the next question comes within microseconds to a call's length */
    ClockLoop L = {0}, opening = {0};
    for (;;) {
        if (spin && spin_s > 0) {
            struct pollfd p = {from_worker, POLLIN, 0};
            while (now_s() - answered < spin_s && poll(&p, 1, 0) == 0)
                ;
        }
        ssize_t r = read(from_worker, q + qn, sizeof q - qn);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        double heard = now_s();
        qn += (size_t)r;
        char *nl;
        while ((nl = memchr(q, '\n', qn)) != NULL) {
            size_t len = (size_t)(nl - q) + 1, an = 0;
            int mark = len == 2 && (q[0] == 'T' || q[0] == 'D');
            long call = L.open && L.expect == 'R' ? clock_r_call(q, len) : -1;
            int warm = L.open && L.expect == 'T' && len == 4 && memcmp(q, "W 0\n", 4) == 0; /* a warm-up's, in turn */
            double window = (heard - answered) * 1e6;
            int hn;
            spin = mark;
            if (mark || q[0] == 'R')
                L.expect = q[0] == 'T' ? 'D' : q[0] == 'D' ? 'R' : 'T';
            if ((call >= 0 && call == L.calls) || warm) { /* the harness's R or W in turn: answered here, the thread told */
                uint64_t seed = 0;
                long drop = -1;
                if (thread_gone(from_referee) || random_u64(&seed) < 0)
                    goto done;
                seed &= (1ULL << 40) - 1; /* referee.py SEED_BITS */
                int keep = warm ? 0 : clock_reservoir(&L, call, &drop);
                L.calls += !warm;
                int n = snprintf(a, sizeof a, "S %llu %d %ld\n", (unsigned long long)seed, keep, drop);
                answered = now_s();
                if (relay_write(to_worker, a, (size_t)n) < 0)
                    goto done;
                hn = snprintf(head, sizeof head, "%.3f:%llu:%d:%ld ", window, (unsigned long long)seed, keep, drop);
                if (relay_write(to_referee, head, (size_t)hn) < 0 || relay_write(to_referee, q, len) < 0)
                    goto done;
                memmove(q, q + len, qn - len);
                qn -= len;
                continue;
            }
            opening = q[0] == 'B' ? clock_heard_b(q, len) : (ClockLoop){0};
            hn = snprintf(head, sizeof head, "%.3f ", window);
            if (relay_write(to_referee, head, (size_t)hn) < 0 || relay_write(to_referee, q, len) < 0)
                goto done;
            int closing = len == 2 && q[0] == 'E';
            memmove(q, q + len, qn - len);
            qn -= len;
            if (mark) { /* answered here, the referee told (it keeps the order of the marks and the questions) */
                answered = now_s();
                if (relay_write(to_worker, "G\n", 2) < 0)
                    goto done;
                continue;
            }
            while (an == 0 || (a[an - 1] != '\n' && an < sizeof a)) {
                ssize_t k = read(from_referee, a + an, sizeof a - an);
                if (k < 0 && errno == EINTR)
                    continue;
                if (k <= 0)
                    goto done;
                an += (size_t)k;
            }
            if (an == 2 && a[0] == 'G' && opening.open) { /* the thread opened the loop */
                L = opening;
            } else if (an == 2 && a[0] == 'G' && closing) {
                L.open = 0;
            }
            answered = now_s();
            if (relay_write(to_worker, a, an) < 0)
                goto done;
        }
        if (qn == sizeof q) {
            relay_write(to_referee, "0 X\n", 4);
            break;
        }
    }
done:
    close(to_referee);
    close(from_worker);
    close(to_worker);
    close(from_referee);
    return 0;
}

static struct PyModuleDef timer_module = {PyModuleDef_HEAD_INIT, "_optagent_timer", NULL, -1, timer_methods};

PyMODINIT_FUNC PyInit__optagent_timer(void) {
    PyObject *m = PyModule_Create(&timer_module);
    if (m == NULL)
        return NULL;
    SessionType = PyType_FromSpec(&session_spec);
    if (SessionType == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
