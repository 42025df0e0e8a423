/*
 * The parent side of the doctor (fp4d_doctor_run): one child process per backend and
 * device, several at once, each re-executing this program as `__child` (libuv's test
 * runner does the same). The child streams one JSON line per event over a pipe (child.c),
 * so the parent always knows which case is running and what phase it is in:
 *
 *  - a signal (SEGV, ILL, BUS, ABRT, ...) costs the running case a CRASH naming the signal;
 *  - the backend call running past its limit (FP4DOCTOR_TIMEOUT_SCALE scales it) costs a
 *    TIMEOUT, the child is killed;
 *  - in both cases a FRESH child runs the backend's remaining cases (a crash may leave a
 *    poisoned GPU context behind: never reuse the process), and so it does when a child
 *    retires itself after a case that left its CUDA context lost (a sticky error: child.c). After a backend's second
 *    TIMEOUT its remaining cases are marked not run, because every further hang would cost
 *    another full time limit.
 * Results are stored by (backend, case), so the report's order does not depend on which
 * child finished first.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/gpu_info.h"
#include "backend/verdict_cache.h"
#include "doctor_internal.h"
#include "clock.h"
#include "internal.h"

#define MAX_TIMEOUTS_PER_BACKEND 2

typedef enum phase { PH_STARTING, PH_PREPARING, PH_CALLING, PH_JUDGING } phase;

typedef struct job {
    const fp4d_backend_iface *iface;
    int                 device;
    fp4d_backend_report *rep;
    int32_t            *todo;      /* case indices to run, in order */
    size_t              ntodo, pos;/* todo[pos] is the next case without a result */
    pid_t               pid;
    int                 fd;
    char               *buf;
    size_t              len, cap;
    phase               ph;
    int32_t             current;
    bool                first_in_child;
    double              deadline;
    int                 timeouts;
    bool                unavailable, fatal, running, done;
    bool                retired;   /* the child said its device is lost: restart, no fault */
} job;

static const fp4d_case *g_cases;
static const fp4d_doctor_options *g_opt;
static size_t g_done, g_total;

static void progress(const job *j)
{
    g_done++;
    if (g_opt->progress) g_opt->progress(g_opt->progress_user, j->iface->name, j->device, g_done, g_total);
}

/* Marks todo[pos..] with a verdict and stops the job. */
static void mark_rest(job *j, fp4d_verdict v, bool ran, const char *detail)
{
    for (; j->pos < j->ntodo; j->pos++) {
        fp4d_case_result *r = &j->rep->results[j->todo[j->pos]];
        memset(r, 0, sizeof *r);
        r->verdict = v;
        r->ran = ran;
        snprintf(r->detail, sizeof r->detail, "%s", detail);
        progress(j);
    }
    j->done = true;
}

static fp4d_status spawn(job *j)
{
    const fp4d_doctor_options *o = g_opt;
    char dev[16], seed[32], suite[16];
    snprintf(dev, sizeof dev, "%d", j->device);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    snprintf(suite, sizeof suite, "%s", fp4d_suite_name(o->suite));
    size_t list_cap = (j->ntodo - j->pos) * 12 + 1;
    char *list = malloc(list_cap);
    FP4D_RETURN_ERROR_IF(!list, NOMEM, "out of memory");
    size_t len = 0;
    list[0] = '\0';
    for (size_t i = j->pos; i < j->ntodo; i++)
        len += (size_t)snprintf(list + len, list_cap - len, "%s%d", i > j->pos ? "," : "", j->todo[i]);
    const char *argv[32 + 2 * 64];
    int argc = 0;
    const char *exe = o->self_exe ? o->self_exe : "/proc/self/exe";
    argv[argc++] = exe;
    argv[argc++] = "__child";
    argv[argc++] = "--backend", argv[argc++] = j->iface->name;
    argv[argc++] = "--device", argv[argc++] = dev;
    argv[argc++] = "--suite", argv[argc++] = suite;
    argv[argc++] = "--seed", argv[argc++] = seed;
    argv[argc++] = "--cases", argv[argc++] = list;
    argv[argc++] = "--fd", argv[argc++] = "3";
    if (o->include_faulty) argv[argc++] = "--include-faulty";
    for (size_t i = 0; i < o->num_plugins && i < 64; i++) argv[argc++] = "--plugin", argv[argc++] = o->plugins[i];
    argv[argc] = NULL;

    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        free(list);
        return fp4d_set_error(FP4D_STATUS_INTERNAL, "pipe: %s", strerror(errno));
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        free(list);
        close(p[0]), close(p[1]);
        return fp4d_set_error(FP4D_STATUS_INTERNAL, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        /* The child: results on fd 3, anything the backend prints on stdout goes to
         * stderr so it cannot corrupt `--json -`. Only async-signal-safe calls here. */
        if (!fp4d_child_dies_with_parent(parent)) _exit(127);
        if (p[1] == 3) fcntl(3, F_SETFD, 0);
        else if (dup2(p[1], 3) < 0) _exit(127);
        dup2(2, 1);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    free(list);
    close(p[1]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    j->pid = pid;
    j->fd = p[0];
    j->len = 0;
    j->ph = PH_STARTING;
    j->current = -1;
    j->first_in_child = true;
    j->retired = false;
    j->running = true;
    /* Opening a backend may load plugins and create a GPU context. */
    j->deadline = fp4d_now_s() + 60.0 * fp4d_timeout_scale();
    return FP4D_STATUS_OK;
}

static double judge_timeout(const fp4d_case *c)
{
    double work = (double)c->m * (double)(c->n ? c->n : 16) * (double)c->k;
    /* stress: every output alone, and up to 16 made beside the others, judged exactly */
    if (c->op == FP4D_CASE_STRESS) work *= 3.0;
    double nk = (double)(c->n ? c->n : 16) * (double)c->k * (c->num_experts ? c->num_experts : 1);
    return (60.0 + work / 2e8 + nk / 2e7) * fp4d_timeout_scale();
}

static void handle_line(job *j, const char *line)
{
    json_error_t err;
    json_t *ev = json_loads(line, 0, &err);
    if (!ev) return; /* a line the backend printed through some other path: ignore */
    const char *name = json_string_value(json_object_get(ev, "event"));
    int32_t ci = (int32_t)json_integer_value(json_object_get(ev, "case"));
    bool needs_dev = (j->iface->caps & FP4D_CAP_NEEDS_DEVICE) != 0;
    if (!name) {
    } else if (!strcmp(name, "ready")) {
        j->deadline = fp4d_now_s() + 60.0 * fp4d_timeout_scale();
    } else if (!strcmp(name, "unavailable")) {
        const char *why = json_string_value(json_object_get(ev, "reason"));
        snprintf(j->rep->unavailable, sizeof j->rep->unavailable, "%s",
                 why && why[0] ? why : "unavailable");
        j->unavailable = true;
    } else if (!strcmp(name, "retire")) {
        j->retired = true;
    } else if (!strcmp(name, "fatal")) {
        const char *why = json_string_value(json_object_get(ev, "message"));
        snprintf(j->rep->unavailable, sizeof j->rep->unavailable, "child failed: %s", why ? why : "?");
        j->fatal = true;
    } else if (!strcmp(name, "case")) {
        j->ph = PH_PREPARING;
        j->current = ci;
        j->deadline = fp4d_now_s() + judge_timeout(&g_cases[ci]);
    } else if (!strcmp(name, "call")) {
        j->ph = PH_CALLING;
        j->deadline = fp4d_now_s() + fp4d_case_call_timeout(&g_cases[ci], j->iface->kind, needs_dev,
                                                        j->first_in_child);
    } else if (!strcmp(name, "called")) {
        j->ph = PH_JUDGING;
        j->deadline = fp4d_now_s() + judge_timeout(&g_cases[ci]);
    } else if (!strcmp(name, "result")) {
        if (j->pos < j->ntodo && j->todo[j->pos] == ci) {
            fp4d_result_from_json(json_object_get(ev, "result"), &j->rep->results[ci]);
            j->pos++;
            progress(j);
        }
        j->ph = PH_STARTING;
        j->current = -1;
        j->first_in_child = false;
        j->deadline = fp4d_now_s() + 60.0 * fp4d_timeout_scale();
    }
    json_decref(ev);
}

/* Reads what the child wrote; returns true at end of file (the child closed the pipe). */
static bool read_child(job *j)
{
    for (;;) {
        if (j->cap - j->len < 4096) {
            size_t cap = j->cap ? j->cap * 2 : 16384;
            char *b = realloc(j->buf, cap);
            if (!b) return false;
            j->buf = b;
            j->cap = cap;
        }
        ssize_t n = read(j->fd, j->buf + j->len, j->cap - j->len - 1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return false; /* EAGAIN: drained for now */
        if (n == 0) return true;
        j->len += (size_t)n;
        j->buf[j->len] = '\0';
        char *start = j->buf, *nl;
        while ((nl = memchr(start, '\n', (size_t)(j->buf + j->len - start)))) {
            *nl = '\0';
            handle_line(j, start);
            start = nl + 1;
        }
        size_t rest = (size_t)(j->buf + j->len - start);
        memmove(j->buf, start, rest);
        j->len = rest;
    }
}

static void record_current(job *j, fp4d_verdict v, int sig, const char *fmt, ...) FP4D_PRINTF(4, 5);
static void record_current(job *j, fp4d_verdict v, int sig, const char *fmt, ...)
{
    if (j->pos >= j->ntodo) return;
    fp4d_case_result *r = &j->rep->results[j->todo[j->pos]];
    memset(r, 0, sizeof *r);
    r->verdict = v;
    r->signal = sig;
    r->ran = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->detail, sizeof r->detail, fmt, ap);
    va_end(ap);
    j->pos++;
    progress(j);
}

static const char *phase_words(phase ph)
{
    switch (ph) {
    case PH_CALLING: return "in the backend call";
    case PH_JUDGING: return "after the backend returned (while checking its output)";
    case PH_PREPARING: return "while building the inputs";
    default: return "between cases";
    }
}

/* The child is gone (EOF, or killed by us). Classify and decide whether to restart. */
static fp4d_status child_ended(job *j, bool killed_for_timeout, double limit)
{
    int status = 0;
    while (waitpid(j->pid, &status, 0) < 0 && errno == EINTR) {}
    close(j->fd);
    j->fd = -1;
    j->running = false;
    bool in_case = j->ph != PH_STARTING && j->current >= 0 && j->pos < j->ntodo &&
                   j->todo[j->pos] == j->current;
    if (killed_for_timeout) {
        if (in_case && j->ph == PH_CALLING) {
            j->timeouts++;
            record_current(j, FP4D_VERDICT_TIMEOUT, 0,
                           "the backend did not return within %.1f s (FP4DOCTOR_TIMEOUT_SCALE "
                           "scales the limit); the child was killed", limit);
        } else if (in_case) {
            record_current(j, FP4D_VERDICT_ERROR, 0,
                           "the doctor's own work %s took longer than %.0f s; raise "
                           "FP4DOCTOR_TIMEOUT_SCALE", phase_words(j->ph), limit);
        } else if (j->first_in_child) {
            mark_rest(j, FP4D_VERDICT_ERROR, false, "not run: the backend did not open within its time limit");
            return FP4D_STATUS_OK;
        } /* else: killed between two cases (the last result arrived just in time): go on */
    } else if (j->unavailable) {
        mark_rest(j, FP4D_VERDICT_UNSUPPORTED, false, j->rep->unavailable);
        return FP4D_STATUS_OK;
    } else if (j->fatal) {
        mark_rest(j, FP4D_VERDICT_ERROR, false, j->rep->unavailable);
        return FP4D_STATUS_OK;
    } else if (j->retired && !in_case) {
        /* the child ended itself after a result, its CUDA context lost (child.c): the case
         * that broke it has its verdict; the rest go to a fresh child below. However it
         * exited: closing a backend on a lost context may itself crash, and that must not
         * cost the cases it never started. */
        j->retired = false;
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        if (!in_case) {
            char msg[FP4D_DETAIL_MAX];
            snprintf(msg, sizeof msg, "not run: the child died of signal %d (%s) %s", sig,
                     strsignal(sig), phase_words(j->ph));
            mark_rest(j, FP4D_VERDICT_CRASH, false, msg);
            return FP4D_STATUS_OK;
        }
        record_current(j, FP4D_VERDICT_CRASH, sig, "the child died of signal %d (%s) %s", sig,
                       strsignal(sig), phase_words(j->ph));
    } else if (j->pos < j->ntodo) {
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (!in_case) {
            char msg[FP4D_DETAIL_MAX];
            snprintf(msg, sizeof msg, "not run: the child exited with code %d %s%s", code,
                     phase_words(j->ph), code == 127 ? " (could not execute fp4doctor)" : "");
            mark_rest(j, FP4D_VERDICT_ERROR, false, msg);
            return FP4D_STATUS_OK;
        }
        record_current(j, FP4D_VERDICT_ERROR, 0, "the child exited with code %d %s (the backend "
                       "called exit()?)", code, phase_words(j->ph));
    }
    if (j->pos >= j->ntodo) {
        j->done = true;
        return FP4D_STATUS_OK;
    }
    if (j->timeouts >= MAX_TIMEOUTS_PER_BACKEND) {
        mark_rest(j, FP4D_VERDICT_ERROR, false,
                  "not run: this backend already timed out twice in this run (each hang costs a "
                  "full time limit)");
        return FP4D_STATUS_OK;
    }
    return spawn(j);
}

static fp4d_status run_jobs(job *jobs, size_t njobs, int max_parallel)
{
    size_t next = 0;
    struct pollfd *pfd = calloc(njobs ? njobs : 1, sizeof *pfd);
    size_t *map = calloc(njobs ? njobs : 1, sizeof *map);
    FP4D_RETURN_ERROR_IF(!pfd || !map, NOMEM, "out of memory");
    fp4d_status st = FP4D_STATUS_OK;
    for (;;) {
        size_t active = 0;
        for (size_t i = 0; i < njobs; i++) active += jobs[i].running;
        while (active < (size_t)max_parallel && next < njobs) {
            job *j = &jobs[next++];
            if (j->ntodo == 0) {
                j->done = true;
                continue;
            }
            st = spawn(j);
            if (st != FP4D_STATUS_OK) goto out;
            active++;
        }
        if (active == 0 && next >= njobs) break;
        size_t np = 0;
        double t = fp4d_now_s(), wait = 1.0;
        for (size_t i = 0; i < njobs; i++) {
            if (!jobs[i].running) continue;
            pfd[np].fd = jobs[i].fd;
            pfd[np].events = POLLIN;
            pfd[np].revents = 0;
            map[np++] = i;
            if (jobs[i].deadline - t < wait) wait = jobs[i].deadline - t;
        }
        if (wait < 0) wait = 0;
        int rc = poll(pfd, np, (int)ceil(wait * 1000.0));
        if (rc < 0 && errno != EINTR) {
            st = fp4d_set_error(FP4D_STATUS_INTERNAL, "poll: %s", strerror(errno));
            goto out;
        }
        for (size_t p = 0; p < np; p++) {
            job *j = &jobs[map[p]];
            if (!(pfd[p].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (read_child(j)) {
                st = child_ended(j, false, 0);
                if (st != FP4D_STATUS_OK) goto out;
            }
        }
        t = fp4d_now_s();
        for (size_t i = 0; i < njobs; i++) {
            job *j = &jobs[i];
            if (!j->running || t < j->deadline) continue;
            /* Limit that applied, for the message. */
            double limit = j->ph == PH_CALLING
                               ? fp4d_case_call_timeout(&g_cases[j->current], j->iface->kind,
                                                        (j->iface->caps & FP4D_CAP_NEEDS_DEVICE) != 0,
                                                        j->first_in_child)
                               : (j->current >= 0 ? judge_timeout(&g_cases[j->current]) : 60.0);
            kill(j->pid, SIGKILL);
            read_child(j);
            st = child_ended(j, true, limit);
            if (st != FP4D_STATUS_OK) goto out;
        }
    }
out:
    for (size_t i = 0; i < njobs; i++)
        if (jobs[i].running) {
            kill(jobs[i].pid, SIGKILL);
            waitpid(jobs[i].pid, NULL, 0);
            close(jobs[i].fd);
            jobs[i].running = false;
        }
    free(pfd);
    free(map);
    return st;
}

/* ---------------------------------------------------------------------------------------
 * After the run: M-dependence, summaries, the recommendation
 * ------------------------------------------------------------------------------------- */

static bool hard_failure(fp4d_verdict v)
{
    return v == FP4D_VERDICT_UNWRITTEN || v == FP4D_VERDICT_NAN || v == FP4D_VERDICT_INF ||
           v == FP4D_VERDICT_ZEROS || v == FP4D_VERDICT_WRONG || v == FP4D_VERDICT_INACCURATE;
}

static bool passes(fp4d_verdict v) { return v == FP4D_VERDICT_PASS; }

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The largest power of two from 16 up that divides every failing M and no passing one
 * (128: "the full 128-row tiles fail"), or 0. */
static int64_t failing_multiple(const int64_t *fail, size_t nf, const int64_t *pass, size_t np)
{
    int64_t best = 0;
    for (int64_t p = 16; p <= ((int64_t)1 << 20); p *= 2) {
        bool ok = true;
        for (size_t i = 0; i < nf && ok; i++) ok = fail[i] % p == 0;
        for (size_t i = 0; i < np && ok; i++) ok = pass[i] % p != 0;
        if (ok) best = p;
    }
    return best;
}

/* "fails for M in 48..257 (tested: 1, 7, ...), passes M <= 17" into out. When passing M lie
 * between the failing ones, the failing M are listed one by one instead of as a range
 * ("fails for M in 128..4096, passes M <= 127 and some M in between" hid that exactly the
 * multiples of 128 failed), with the multiple they share. */
static void describe_m(const int64_t *fail, size_t nf, const int64_t *pass, size_t np, char *out, size_t size)
{
    int64_t all[128];
    size_t na = 0;
    for (size_t i = 0; i < nf && na < 128; i++) all[na++] = fail[i];
    for (size_t i = 0; i < np && na < 128; i++) all[na++] = pass[i];
    qsort(all, na, sizeof *all, cmp_i64);
    bool inside = false;
    for (size_t i = 0; i < np; i++) inside |= pass[i] > fail[0] && pass[i] < fail[nf - 1];
    int len;
    if (inside) {
        len = snprintf(out, size, "fails for M =");
        for (size_t i = 0; i < nf && len > 0 && (size_t)len < size; i++)
            len += snprintf(out + len, size - (size_t)len, "%s %lld", i ? "," : "", (long long)fail[i]);
        int64_t mult = failing_multiple(fail, nf, pass, np);
        if (mult > 0 && len > 0 && (size_t)len < size)
            len += snprintf(out + len, size - (size_t)len, " (the multiples of %lld)", (long long)mult);
        if (len > 0 && (size_t)len < size) len += snprintf(out + len, size - (size_t)len, ", passes the other M (tested:");
    } else {
        len = snprintf(out, size, "fails for M in %lld..%lld (tested:", (long long)fail[0], (long long)fail[nf - 1]);
    }
    for (size_t i = 0; i < na && len > 0 && (size_t)len < size; i++)
        len += snprintf(out + len, size - (size_t)len, "%s %lld", i ? "," : "", (long long)all[i]);
    if (inside) {
        if (len > 0 && (size_t)len < size) snprintf(out + len, size - (size_t)len, ")");
        return;
    }
    int64_t below = -1, above = -1;
    for (size_t i = 0; i < np; i++) {
        if (pass[i] < fail[0] && pass[i] > below) below = pass[i];
        if (pass[i] > fail[nf - 1] && (above < 0 || pass[i] < above)) above = pass[i];
    }
    if (len > 0 && (size_t)len < size) {
        len += snprintf(out + len, size - (size_t)len, "), passes");
        if (below >= 0) len += snprintf(out + len, size - (size_t)len, " M <= %lld", (long long)below);
        if (above >= 0 && len > 0 && (size_t)len < size)
            snprintf(out + len, size - (size_t)len, "%s M >= %lld", below >= 0 ? " and" : "", (long long)above);
    }
}

static void analyse_m_dependence(fp4d_report *rep, fp4d_backend_report *br, char *mdesc, size_t mdesc_size)
{
    size_t nc = rep->num_cases;
    bool *seen = calloc(nc ? nc : 1, sizeof *seen);
    size_t *members = malloc((nc ? nc : 1) * sizeof *members);
    int64_t *fail = malloc((nc ? nc : 1) * sizeof *fail), *pass = malloc((nc ? nc : 1) * sizeof *pass);
    if (!seen || !members || !fail || !pass) goto out;
    mdesc[0] = '\0';
    size_t best_members = 0;
    for (size_t i = 0; i < nc; i++) {
        if (seen[i] || !fp4d_case_has_m(&rep->cases[i])) continue;
        char key[160], k2[160];
        fp4d_case_shape_key(&rep->cases[i], key, sizeof key);
        size_t nm = 0, nf = 0, np = 0;
        for (size_t j = i; j < nc; j++) {
            if (seen[j] || !fp4d_case_has_m(&rep->cases[j])) continue;
            fp4d_case_shape_key(&rep->cases[j], k2, sizeof k2);
            if (strcmp(key, k2)) continue;
            seen[j] = true;
            members[nm++] = j;
        }
        for (size_t t = 0; t < nm; t++) {
            fp4d_verdict v = br->results[members[t]].verdict;
            if (hard_failure(v)) fail[nf++] = rep->cases[members[t]].m;
            else if (passes(v)) pass[np++] = rep->cases[members[t]].m;
        }
        if (nf == 0 || np == 0) continue;
        qsort(fail, nf, sizeof *fail, cmp_i64);
        qsort(pass, np, sizeof *pass, cmp_i64);
        char desc[320];
        describe_m(fail, nf, pass, np, desc, sizeof desc);
        const fp4d_case *c0 = &rep->cases[members[0]];
        /* The summary describes the shape with the widest M sweep (the default suite's
         * 1..4096 sweep says more than the quick 1..257 one). */
        if (nm > best_members) {
            best_members = nm;
            snprintf(mdesc, mdesc_size, "%s on N=%lld K=%lld", desc, (long long)c0->n, (long long)c0->k);
        }
        for (size_t t = 0; t < nm; t++) {
            fp4d_case_result *r = &br->results[members[t]];
            if (!hard_failure(r->verdict)) continue;
            if (r->cause == FP4D_CAUSE_NONE || r->cause == FP4D_CAUSE_UNKNOWN) {
                r->cause = FP4D_CAUSE_M_DEPENDENT;
                size_t len = strlen(r->detail);
                snprintf(r->detail + len, sizeof r->detail - len, "; m_dependent: %s", desc);
            }
        }
    }
out:
    free(seen), free(members), free(fail), free(pass);
}

static void summarise_backend(fp4d_report *rep, fp4d_backend_report *br)
{
    char mdesc[sizeof br->summary - 64];
    analyse_m_dependence(rep, br, mdesc, sizeof mdesc);
    fp4d_verdict worst = FP4D_VERDICT_UNSUPPORTED;
    size_t nworst = 0, first = (size_t)-1, nrun = 0;
    int cause_count[FP4D_CAUSE_COUNT] = {0};
    for (size_t i = 0; i < rep->num_cases; i++) {
        fp4d_verdict v = br->results[i].verdict;
        if (v != FP4D_VERDICT_UNSUPPORTED) nrun++;
        if (v < worst) worst = v, nworst = 0, first = i, memset(cause_count, 0, sizeof cause_count);
        if (v == worst) {
            nworst++;
            cause_count[br->results[i].cause]++;
            if (first == (size_t)-1) first = i;
        }
        if (v == FP4D_VERDICT_PASS && fp4d_case_has_m(&rep->cases[i]) && br->results[i].gflops > br->best_gflops)
            br->best_gflops = br->results[i].gflops;
    }
    br->verdict = worst;
    /* The most frequent specific cause among the worst cases; "unknown" if none. */
    fp4d_cause cause = FP4D_CAUSE_NONE;
    int best = 0;
    for (int c = 1; c < FP4D_CAUSE_COUNT; c++)
        if (c != FP4D_CAUSE_UNKNOWN && cause_count[c] > best) best = cause_count[c], cause = (fp4d_cause)c;
    if (cause == FP4D_CAUSE_NONE && cause_count[FP4D_CAUSE_UNKNOWN]) cause = FP4D_CAUSE_UNKNOWN;
    /* The worst cases may carry no signature while the backend's other wrong outputs name
     * the mistake: e4m3 scales decoded as ue8m0 underflow an f16 output to all zeros (ZEROS,
     * indistinguishable from a kernel that never ran) and give WRONG with a clear match
     * everywhere else. Then the backend's cause is the most frequent specific cause among
     * all its wrong outputs, and the summary says where it comes from. */
    fp4d_cause borrowed = FP4D_CAUSE_NONE;
    int borrowed_n = 0, wrong_n = 0;
    if ((cause == FP4D_CAUSE_NONE || cause == FP4D_CAUSE_UNKNOWN) && hard_failure(worst)) {
        int all_count[FP4D_CAUSE_COUNT] = {0};
        for (size_t i = 0; i < rep->num_cases; i++)
            if (hard_failure(br->results[i].verdict)) all_count[br->results[i].cause]++, wrong_n++;
        for (int c = 1; c < FP4D_CAUSE_COUNT; c++)
            if (c != FP4D_CAUSE_UNKNOWN && all_count[c] > borrowed_n) borrowed_n = all_count[c], borrowed = (fp4d_cause)c;
        if (borrowed != FP4D_CAUSE_NONE) cause = borrowed;
    }
    br->cause = cause;
    if (br->unavailable[0] && nrun == 0) {
        snprintf(br->summary, sizeof br->summary, "UNSUPPORTED here: %s", br->unavailable);
    } else if (worst == FP4D_VERDICT_PASS) {
        snprintf(br->summary, sizeof br->summary, "passed all %zu cases it supports", nrun);
    } else if (worst == FP4D_VERDICT_UNSUPPORTED) {
        snprintf(br->summary, sizeof br->summary, "supports none of the cases: %s",
                 first != (size_t)-1 ? br->results[first].detail : "");
    } else {
        /* Name the first case with the chosen cause. */
        size_t pick = first;
        for (size_t i = 0; i < rep->num_cases; i++)
            if (br->results[i].verdict == worst && br->results[i].cause == cause) {
                pick = i;
                break;
            }
        int len;
        if (cause == FP4D_CAUSE_M_DEPENDENT && borrowed == FP4D_CAUSE_NONE) {
            /* Which M, then what one failing output looks like (where the NaN tile sits:
             * "within rows 0..127 x cols 0..127" is the clue to a 128x128 tile), without the
             * M description the case's detail repeats. */
            const char *d = br->results[pick].detail, *tail = strstr(d, "; m_dependent: ");
            len = snprintf(br->summary, sizeof br->summary, "%s in %zu of %zu cases; %s; e.g. %s: %.*s",
                           fp4d_verdict_name(worst), nworst, nrun, mdesc, rep->cases[pick].name,
                           (int)(tail ? (size_t)(tail - d) : strlen(d)), d);
        }
        else
            len = snprintf(br->summary, sizeof br->summary, "%s in %zu of %zu cases (e.g. %s): %s",
                           fp4d_verdict_name(worst), nworst, nrun, rep->cases[pick].name,
                           br->results[pick].detail);
        if (borrowed != FP4D_CAUSE_NONE && len > 0 && (size_t)len < sizeof br->summary)
            snprintf(br->summary + len, sizeof br->summary - (size_t)len,
                     "; cause from its other wrong outputs: %s in %d of %d", fp4d_cause_name(borrowed),
                     borrowed_n, wrong_n);
    }
}

/* The first device on which the backend of row b (a GPU backend under --device all) has a
 * failing verdict, or -2 when it fails on none. */
static int failing_device(const fp4d_report *rep, size_t b)
{
    for (size_t o = 0; o < rep->num_backends; o++)
        if (o != b && !strcmp(rep->backends[o].name, rep->backends[b].name) &&
            fp4d_verdict_is_failure(rep->backends[o].verdict))
            return rep->backends[o].device;
    return -2;
}

/* Cases of row br that were selected, and of those the ones it ran (did not call
 * unsupported): "passed every case" must not stand for a backend that ran a third of them. */
static void case_counts(const fp4d_report *rep, const fp4d_backend_report *br, size_t *selected, size_t *ran)
{
    *selected = *ran = 0;
    for (size_t i = 0; i < rep->num_cases; i++) {
        const fp4d_case_result *r = &br->results[i];
        if (r->verdict == FP4D_VERDICT_UNSUPPORTED && !r->ran && !strcmp(r->detail, "not selected")) continue;
        (*selected)++;
        if (r->verdict != FP4D_VERDICT_UNSUPPORTED) (*ran)++;
    }
}

/* The recommendation is one line (at most 255 characters: long names cut its tail). */
static void set_recommendation(fp4d_report *rep, const char *fmt, ...) FP4D_PRINTF(2, 3);
static void set_recommendation(fp4d_report *rep, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->recommendation, sizeof rep->recommendation, fmt, ap);
    va_end(ap);
}

static void recommend(fp4d_report *rep)
{
    /* One candidate per backend name: under --device all a GPU backend has a row per device,
     * and it qualifies only when it failed on none of them (a backend that is wrong on one
     * GPU is not one to serve a model across them with; it was recommended by the row of a
     * device it passed on). */
    size_t cand[256], nc = 0, split = (size_t)-1;
    int split_dev = -2;
    for (int pass = 0; pass < 2 && nc == 0; pass++)
        for (size_t b = 0; b < rep->num_backends && nc < 256; b++) {
            fp4d_backend_report *br = &rep->backends[b];
            if (br->verdict != FP4D_VERDICT_PASS || br->kind == FP4D_BACKEND_KIND_FAULTY) continue;
            bool is_ref = br->kind == FP4D_BACKEND_KIND_REFERENCE;
            if (pass == 0 && is_ref) continue;
            bool seen = false;
            for (size_t t = 0; t < nc && !seen; t++) seen = !strcmp(rep->backends[cand[t]].name, br->name);
            if (seen) continue;
            int bad_dev = failing_device(rep, b);
            if (bad_dev != -2) {
                if (split == (size_t)-1) split = b, split_dev = bad_dev;
                continue;
            }
            cand[nc++] = b;
        }
    rep->recommended[0] = '\0';
    char note[128] = "";
    if (split != (size_t)-1)
        snprintf(note, sizeof note, "; not %s: it passed on device %d but fails on device %d",
                 rep->backends[split].name, rep->backends[split].device, split_dev);
    if (nc == 0) {
        bool ran_any = false;
        for (size_t b = 0; b < rep->num_backends && !ran_any; b++)
            ran_any = rep->backends[b].verdict != FP4D_VERDICT_UNSUPPORTED;
        if (ran_any)
            set_recommendation(rep, "no backend passed: do not serve FP4 models with these backends on this machine%s", note);
        else
            set_recommendation(rep, "none: no backend ran any selected case here (unavailable, or no case selected)");
        return;
    }
    /* Compare on the largest GEMM case that every candidate passed. */
    size_t best_case = (size_t)-1;
    double best_work = -1;
    for (size_t i = 0; i < rep->num_cases; i++) {
        const fp4d_case *c = &rep->cases[i];
        if (!fp4d_case_has_m(c)) continue;
        bool all = true;
        for (size_t t = 0; t < nc && all; t++) all = rep->backends[cand[t]].results[i].verdict == FP4D_VERDICT_PASS;
        double work = (double)c->m * (double)c->n * (double)c->k;
        if (all && work > best_work) best_work = work, best_case = i;
    }
    size_t win = cand[0];
    for (size_t t = 1; t < nc; t++) {
        const fp4d_backend_report *a = &rep->backends[cand[t]], *w = &rep->backends[win];
        double ta = best_case != (size_t)-1 ? a->results[best_case].time_ms : 1.0 / (a->best_gflops + 1e-30);
        double tw = best_case != (size_t)-1 ? w->results[best_case].time_ms : 1.0 / (w->best_gflops + 1e-30);
        if (ta < tw) win = cand[t];
    }
    const fp4d_backend_report *w = &rep->backends[win];
    snprintf(rep->recommended, sizeof rep->recommended, "%s", w->name);
    size_t selected, ran;
    case_counts(rep, w, &selected, &ran);
    char only[96] = "";
    if (ran < selected) snprintf(only, sizeof only, "; it supports only %zu of the %zu cases", ran, selected);
    if (nc == 1)
        set_recommendation(rep, "%s: the only %sbackend that passed every case%s%s%s", w->name,
                           w->kind == FP4D_BACKEND_KIND_REFERENCE ? "" : "non-reference ",
                           w->kind == FP4D_BACKEND_KIND_REFERENCE ? " (the exact reference is slow: fix or add a fast backend)"
                                                                  : "",
                           only, note);
    else if (best_case != (size_t)-1)
        set_recommendation(rep, "%s: fastest of %zu backends that passed every case they support (%.3f ms on %s)%s%s",
                           w->name, nc, w->results[best_case].time_ms, rep->cases[best_case].name, only, note);
    else
        set_recommendation(rep, "%s: fastest of %zu passing backends%s%s", w->name, nc, only, note);
}

/* ---------------------------------------------------------------------------------------
 * fp4d_doctor_run
 * ------------------------------------------------------------------------------------- */

bool fp4d_case_selected(const fp4d_doctor_options *o, const fp4d_case *c)
{
    if (!o->case_filter || o->num_case_filters == 0) return true;
    for (size_t i = 0; i < o->num_case_filters; i++)
        if (strstr(c->name, o->case_filter[i])) return true;
    return false;
}

/* A positive count from the environment (FP4DOCTOR_SIMULATE_DEVICES), else 0 (digits only,
 * as the child reads it; anything else is ignored with fp4d_env_knob's warning). */
static int env_device_count(const char *name)
{
    const long n = fp4d_env_knob(name, 0, 1000000, 0);
    if (n <= 0) return 0;
    return n > FP4D_MAX_REPORT_DEVICES ? FP4D_MAX_REPORT_DEVICES : (int)n;
}

/*
 * --device all: the same backend on several devices should agree case by case. For each
 * backend row whose verdicts differ from the majority of its siblings (ties: from the
 * lowest device), say which cases and how, so that a broken GPU stands out.
 */
static void note_device_differences(fp4d_report *rep)
{
    for (size_t b = 0; b < rep->num_backends; b++) {
        fp4d_backend_report *br = &rep->backends[b];
        if (br->device < 0) continue;
        /* siblings: the same backend on other devices */
        size_t agree_rows = 0, rows = 0;
        const fp4d_backend_report *ref_row = NULL;
        for (size_t o = 0; o < rep->num_backends; o++) {
            const fp4d_backend_report *ob = &rep->backends[o];
            if (o == b || ob->device < 0 || strcmp(ob->name, br->name)) continue;
            rows++;
            bool same = true;
            for (size_t c = 0; c < rep->num_cases && same; c++) same = ob->results[c].verdict == br->results[c].verdict;
            if (same) agree_rows++;
            else if (!ref_row) ref_row = ob;
        }
        /* Flag this row when no sibling agrees with it. Of a disagreeing pair, flag the one
         * with the worse overall verdict (the higher-numbered device when they tie). */
        if (rows == 0 || agree_rows > 0 || !ref_row) continue;
        if (rows == 1) {
            bool br_worse  = br->verdict != ref_row->verdict && fp4d_verdict_worst(br->verdict, ref_row->verdict) == br->verdict;
            bool tie_lower = br->verdict == ref_row->verdict && br->device < ref_row->device;
            if (!br_worse && (br->verdict != ref_row->verdict || tie_lower)) continue;
        }
        size_t ndiff = 0, first = (size_t)-1;
        for (size_t c = 0; c < rep->num_cases; c++)
            if (ref_row->results[c].verdict != br->results[c].verdict) {
                if (first == (size_t)-1) first = c;
                ndiff++;
            }
        if (first == (size_t)-1) continue;
        snprintf(br->device_note, sizeof br->device_note,
                 "%s on device %d differs from device %d in %zu case(s), e.g. %s: %s vs %s",
                 br->name, br->device, ref_row->device, ndiff, rep->cases[first].name,
                 fp4d_verdict_name(br->results[first].verdict), fp4d_verdict_name(ref_row->results[first].verdict));
    }
}

/* After the children: verdicts, causes and summaries, devices that disagree, the
 * recommendation (doctor_internal.h). */
void fp4d_report_finish(fp4d_report *rep)
{
    for (size_t b = 0; b < rep->num_backends; b++) summarise_backend(rep, &rep->backends[b]);
    note_device_differences(rep);
    recommend(rep);
}

fp4d_status fp4d_doctor_run(const fp4d_doctor_options *opt, fp4d_report *rep)
{
    FP4D_RETURN_ERROR_IF(!opt || !rep, INVALID_ARG, "NULL argument");
    memset(rep, 0, sizeof *rep);
    double t0 = fp4d_now_s();
    rep->suite = opt->suite;
    rep->seed = opt->seed;
    rep->case_filtered = opt->case_filter && opt->num_case_filters > 0;
    fp4d_registry_options ro = {opt->include_faulty, opt->plugins, opt->num_plugins};
    FP4D_FORWARD_IF_ERROR(fp4d_registry_init(&ro));
    FP4D_FORWARD_IF_ERROR(fp4d_suite_cases(opt->suite, &rep->cases, &rep->num_cases));

    /* Which backends, on which devices. */
    const fp4d_backend_iface *ifaces[256];
    size_t nif = 0;
    if (opt->backends && opt->num_backends) {
        for (size_t i = 0; i < opt->num_backends && nif < 256; i++) {
            const fp4d_backend_iface *bi = fp4d_registry_find(opt->backends[i]);
            if (!bi) {
                fp4d_report_free(rep);
                return fp4d_set_error(FP4D_STATUS_NOT_FOUND, "unknown backend '%s' (see fp4doctor backends)",
                                      opt->backends[i]);
            }
            ifaces[nif++] = bi;
        }
    } else {
        for (size_t i = 0; i < fp4d_registry_count() && nif < 256; i++) ifaces[nif++] = fp4d_registry_get(i);
    }
    fp4d_cuda_info ci;
    fp4d_cuda_query(&ci);
    size_t cap = nif * (size_t)(ci.device_count > 0 ? ci.device_count : 1) + 1;
    rep->backends = calloc(cap, sizeof *rep->backends);
    job *jobs = calloc(cap, sizeof *jobs);
    int32_t *todo = malloc((rep->num_cases ? rep->num_cases : 1) * sizeof *todo);
    if (!rep->backends || !jobs || !todo) {
        free(jobs), free(todo);
        fp4d_report_free(rep);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    size_t ntodo = 0;
    for (size_t i = 0; i < rep->num_cases; i++)
        if (fp4d_case_selected(opt, &rep->cases[i])) todo[ntodo++] = (int32_t)i;

    /* The devices `all` stands for: the real ones, or FP4DOCTOR_SIMULATE_DEVICES logical
     * ones mapped onto them (doctor.h), so the per-device path runs on one GPU or none. */
    int all_devs[FP4D_MAX_REPORT_DEVICES], n_all = 0;
    int simulated = env_device_count("FP4DOCTOR_SIMULATE_DEVICES");
    if (simulated > 0)
        for (int d = 0; d < simulated; d++) all_devs[n_all++] = d;
    else
        for (int d = 0; d < ci.device_count && d < FP4D_MAX_GPUS; d++) all_devs[n_all++] = ci.gpus[d].index;
    /* FP4DOCTOR_FAULTY_DEVICE: faulty backends run per device so a fault pinned to one
     * device can be seen to cost that device's verdicts only. A value that is no device of
     * this run stops it here: read loosely, "abc" pinned the fault to device 0 and "7" (of
     * two devices) to none, and the run then "showed" a fault isolation that never happened. */
    const char *pin = getenv("FP4DOCTOR_FAULTY_DEVICE");
    if (pin && !*pin) pin = NULL; /* empty: unset, as the faulty backends read it */
    if (pin) {
        int pinned = (int)fp4d_env_digits(pin, 1000000);
        bool known = pinned >= 0 && opt->device != FP4D_DEVICE_ALL;
        for (int d = 0; d < n_all && pinned >= 0 && !known; d++) known = all_devs[d] == pinned;
        if (!known) {
            free(jobs), free(todo);
            fp4d_report_free(rep);
            if (pinned < 0)
                return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                                      "FP4DOCTOR_FAULTY_DEVICE='%.40s' is not a device number (a non-negative integer)", pin);
            return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                                  "FP4DOCTOR_FAULTY_DEVICE=%d names no device of --device all (%d device(s)%s)",
                                  pinned, n_all, simulated > 0 ? ", FP4DOCTOR_SIMULATE_DEVICES" : "");
        }
    }
    bool faulty_per_device = opt->device == FP4D_DEVICE_ALL && pin && n_all > 0;
    if (faulty_per_device || simulated > 0) {
        size_t need = nif * (size_t)(n_all > 0 ? n_all : 1) + 1;
        if (need > cap) {
            void *nb = realloc(rep->backends, need * sizeof *rep->backends);
            void *nj = nb ? realloc(jobs, need * sizeof *jobs) : NULL;
            if (nb) rep->backends = nb;
            if (nj) jobs = nj;
            if (!nb || !nj) {
                free(jobs), free(todo);
                fp4d_report_free(rep);
                return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            }
            memset(rep->backends + cap, 0, (need - cap) * sizeof *rep->backends);
            memset(jobs + cap, 0, (need - cap) * sizeof *jobs);
            cap = need;
        }
    }

    fp4d_status st = FP4D_STATUS_OK;
    for (size_t i = 0; i < nif; i++) {
        int devs[FP4D_MAX_REPORT_DEVICES], nd = 0;
        bool per_device = (ifaces[i]->caps & FP4D_CAP_NEEDS_DEVICE) ||
                          (faulty_per_device && ifaces[i]->kind == FP4D_BACKEND_KIND_FAULTY);
        if (!per_device) devs[nd++] = -1;
        else if (opt->device == FP4D_DEVICE_ALL && n_all > 0)
            for (int d = 0; d < n_all; d++) devs[nd++] = all_devs[d];
        else devs[nd++] = opt->device >= 0 ? opt->device : 0;
        for (int d = 0; d < nd; d++) {
            fp4d_backend_report *br = &rep->backends[rep->num_backends];
            job *j = &jobs[rep->num_backends];
            snprintf(br->name, sizeof br->name, "%s", ifaces[i]->name);
            snprintf(br->description, sizeof br->description, "%s", ifaces[i]->description ? ifaces[i]->description : "");
            fp4d_text_clean(br->description);
            br->kind = ifaces[i]->kind;
            br->device = devs[d];
            br->results = calloc(rep->num_cases ? rep->num_cases : 1, sizeof *br->results);
            if (!br->results) st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
            for (size_t c = 0; c < rep->num_cases && br->results; c++) {
                br->results[c].verdict = FP4D_VERDICT_UNSUPPORTED;
                snprintf(br->results[c].detail, sizeof br->results[c].detail, "not selected");
            }
            j->iface = ifaces[i];
            j->device = devs[d];
            j->rep = br;
            j->todo = todo;
            j->ntodo = ntodo;
            j->fd = -1;
            rep->num_backends++;
        }
    }
    g_cases = rep->cases;
    g_opt = opt;
    g_done = 0;
    g_total = ntodo * rep->num_backends;
    /* Sanitizer builds (make asan): AddressSanitizer catches SIGSEGV/SIGBUS itself and
     * turns a crash into exit(1); the children must die of the signal so that the crash is
     * a CRASH. Only the children's environment is affected (ASan reads it at start-up). */
    const char *asan = getenv("ASAN_OPTIONS");
    if (!asan || !strstr(asan, "handle_segv")) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s%shandle_segv=0:handle_sigbus=0:handle_sigill=0:handle_sigfpe=0",
                 asan ? asan : "", asan && asan[0] ? ":" : "");
        setenv("ASAN_OPTIONS", buf, 1);
    }
    /* UndefinedBehaviorSanitizer (no-recover) exits with 1 on e.g. a store through NULL:
     * make it abort, so the crash is still a signal. */
    const char *ubsan = getenv("UBSAN_OPTIONS");
    if (!ubsan || !strstr(ubsan, "abort_on_error")) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s%sabort_on_error=1", ubsan ? ubsan : "", ubsan && ubsan[0] ? ":" : "");
        setenv("UBSAN_OPTIONS", buf, 1);
    }
    /* the children read the same variables: what was said here is not said again per child */
    fp4d_env_knob_pass_warnings();
    int par = opt->jobs > 0 ? opt->jobs : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (par < 1) par = 1;
    if (st == FP4D_STATUS_OK) st = run_jobs(jobs, rep->num_backends, par);
    for (size_t i = 0; i < rep->num_backends; i++) free(jobs[i].buf);
    free(jobs);
    free(todo);
    if (st != FP4D_STATUS_OK) {
        fp4d_report_free(rep);
        return st;
    }
    fp4d_report_finish(rep);
    rep->wall_s = fp4d_now_s() - t0;
    return FP4D_STATUS_OK;
}

void fp4d_report_free(fp4d_report *rep)
{
    if (!rep) return;
    for (size_t b = 0; rep->backends && b < rep->num_backends; b++) free(rep->backends[b].results);
    free(rep->backends);
    free(rep->cases);
    memset(rep, 0, sizeof *rep);
}

int fp4d_report_exit_code(const fp4d_report *rep)
{
    for (size_t b = 0; b < rep->num_backends; b++)
        if (fp4d_verdict_is_failure(rep->backends[b].verdict)) return FP4D_EXIT_FAILED;
    return FP4D_EXIT_OK;
}

fp4d_status fp4d_report_update_cache(const fp4d_report *rep)
{
    fp4d_status st = FP4D_STATUS_OK;
    for (size_t b = 0; b < rep->num_backends; b++) {
        const fp4d_backend_report *br = &rep->backends[b];
        if (br->unavailable[0] || (rep->case_filtered && !fp4d_verdict_is_failure(br->verdict))) continue;
        fp4d_cached_verdict v;
        memset(&v, 0, sizeof v);
        snprintf(v.verdict, sizeof v.verdict, "%s", fp4d_verdict_name(br->verdict));
        snprintf(v.suite, sizeof v.suite, "%s", fp4d_suite_name(rep->suite));
        v.gflops = br->best_gflops;
        fp4d_status s = fp4d_verdict_cache_put(br->name, br->device, &v);
        if (s != FP4D_STATUS_OK) st = s;
    }
    return st;
}
