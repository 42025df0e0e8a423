/*
 * The child side of the doctor: `fp4doctor __child --backend NAME --device D --suite S
 * --seed N --cases I,J,... [--include-faulty] [--plugin LIB]... --fd FD`.
 *
 * Runs the listed cases of one backend and writes one JSON object per line to FD, flushed
 * at once, so that the parent knows exactly where a crash or a hang happened:
 *   {"event":"ready"}                       backend opened
 *   {"event":"unavailable","reason":"..."}  backend cannot run here (then exit 0)
 *   {"event":"case","case":I}               building inputs for case I
 *   {"event":"call","case":I}               calling the backend (the timed part)
 *   {"event":"called","case":I}             the backend returned; judging
 *   {"event":"result","case":I,"result":{...}}
 *   {"event":"retire","reason":"..."}       the device is lost: the remaining cases need a
 *                                           fresh child (then exit 0)
 *   {"event":"fatal","message":"..."}       the child could not start (exit 4)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doctor_internal.h"
#include "internal.h"
#include "backend/gpu_info.h"

static FILE *child_out;

static void emit(json_t *obj)
{
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) return;
    fputs(s, child_out);
    fputc('\n', child_out);
    fflush(child_out);
    free(s);
}

static int current_case = -1;

static void on_call(void *user)
{
    const char *ev = user;
    emit(json_pack("{s:s, s:i}", "event", ev, "case", current_case));
}

/* fp4d_doctor_set_call_hook gets one hook; the judge fires it twice per case (before and
 * after the backend calls), so alternate the event name. */
static int hook_phase;
static void on_hook(void *user)
{
    (void)user;
    on_call(hook_phase == 0 ? "call" : "called");
    hook_phase ^= 1;
}

static int fatal(const char *fmt, const char *arg)
{
    char msg[1024];
    snprintf(msg, sizeof msg, fmt, arg);
    if (child_out) emit(json_pack("{s:s, s:s}", "event", "fatal", "message", msg));
    fprintf(stderr, "fp4doctor __child: %s\n", msg);
    return FP4D_EXIT_INTERNAL;
}

int fp4d_doctor_child_main(int argc, char **argv, int out_fd)
{
    const char *backend = NULL, *suite_name = "quick", *cases_arg = "";
    int device = -1;
    uint64_t seed = 1;
    bool include_faulty = false;
    const char *plugins[64];
    size_t num_plugins = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--include-faulty")) { include_faulty = true; continue; }
        if (!v) break;
        if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--device")) device = atoi(v);
        else if (!strcmp(a, "--suite")) suite_name = v;
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--cases")) cases_arg = v;
        else if (!strcmp(a, "--fd")) out_fd = atoi(v);
        else if (!strcmp(a, "--plugin") && num_plugins < 64) plugins[num_plugins++] = v;
        else continue;
        i++;
    }
    child_out = fdopen(out_fd, "w");
    if (!child_out) {
        fprintf(stderr, "fp4doctor __child: cannot open fd %d: %s\n", out_fd, strerror(errno));
        return FP4D_EXIT_INTERNAL;
    }
    if (!backend) return fatal("%s", "no --backend given");
    fp4d_suite suite;
    if (!fp4d_suite_from_name(suite_name, &suite)) return fatal("unknown suite '%s'", suite_name);

    fp4d_registry_options ro = {include_faulty, plugins, num_plugins};
    if (fp4d_registry_init(&ro) != FP4D_STATUS_OK) return fatal("%s", fp4d_last_error());
    fp4d_case *cases = NULL;
    size_t ncases = 0;
    if (fp4d_suite_cases(suite, &cases, &ncases) != FP4D_STATUS_OK) return fatal("%s", fp4d_last_error());

    fp4d_backend_t b = NULL;
    fp4d_reason why = {{0}};
    /* FP4DOCTOR_SIMULATE_DEVICES (doctor.h): logical device d runs on physical d % count. */
    int physical = device;
    const fp4d_backend_iface *bi = fp4d_registry_find(backend);
    if (device >= 0 && fp4d_env_knob("FP4DOCTOR_SIMULATE_DEVICES", 0, 1000000, 0) > 0 && bi && (bi->caps & FP4D_CAP_NEEDS_DEVICE)) {
        fp4d_cuda_info ci;
        fp4d_cuda_query(&ci);
        if (ci.device_count > 0) physical = ci.gpus[device % ci.device_count].index;
    }
    if (fp4d_backend_open(backend, physical, &b, &why) != FP4D_STATUS_OK) {
        emit(json_pack("{s:s, s:s}", "event", "unavailable", "reason",
                       why.text[0] ? why.text : fp4d_last_error()));
        free(cases);
        return FP4D_EXIT_OK;
    }
    emit(json_pack("{s:s}", "event", "ready"));
    fp4d_doctor_set_call_hook(on_hook, NULL);

    const long retire_after = fp4d_env_digits(getenv("FP4DOCTOR_CHILD_RETIRE_AFTER"), 1000000);
    long results = 0;
    const char *p = cases_arg;
    while (*p) {
        char *end;
        long idx = strtol(p, &end, 10);
        if (end == p) break;
        p = *end == ',' ? end + 1 : end;
        if (idx < 0 || (size_t)idx >= ncases) continue;
        current_case = (int)idx;
        hook_phase = 0;
        emit(json_pack("{s:s, s:i}", "event", "case", "case", current_case));
        fp4d_case_result r;
        if (fp4d_doctor_run_case(b, &cases[idx], seed, &r) != FP4D_STATUS_OK) {
            memset(&r, 0, sizeof r);
            r.ran = true;
            r.verdict = FP4D_VERDICT_ERROR;
            snprintf(r.detail, sizeof r.detail, "the doctor failed: %s", fp4d_last_error());
        }
        emit(json_pack("{s:s, s:i, s:o}", "event", "result", "case", current_case, "result",
                       fp4d_result_to_json(&r)));
        /* A GPU backend's failed case may have left the CUDA context broken: an illegal
         * address or a trap in a kernel is sticky, and every later call in this process fails
         * with it, so each remaining case would be an ERROR repeating the first fault. They run
         * in a fresh child instead, as after a crash. FP4DOCTOR_CHILD_RETIRE_AFTER=N (a test
         * switch, doctor.h) retires every child after N results as if its device were lost. */
        char lost[256] = "";
        results++;
        bool retire = r.verdict == FP4D_VERDICT_ERROR && bi && (bi->caps & FP4D_CAP_NEEDS_DEVICE) &&
                      fp4d_cuda_context_lost(physical < 0 ? 0 : physical, lost, sizeof lost);
        if (!retire && retire_after > 0 && results >= retire_after && *p) {
            snprintf(lost, sizeof lost, "FP4DOCTOR_CHILD_RETIRE_AFTER=%ld", retire_after);
            retire = true;
        }
        if (retire) {
            emit(json_pack("{s:s, s:s}", "event", "retire", "reason", lost));
            break; /* closing frees the host side; on a lost context the CUDA calls just fail */
        }
    }
    fp4d_backend_close(b);
    free(cases);
    fclose(child_out);
    return FP4D_EXIT_OK;
}
