/*
 * `fp4doctor env`: what this machine and this build are (embedded in every report).
 * FP4 bugs are often environment bugs (failures.md §1.3: wrong arch / cubin, toolchain,
 * stale JIT caches), so the first thing a report must say is where it ran.
 */
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <unistd.h>

#include "backend/gpu_info.h"
#include "doctor_internal.h"
#include "internal.h"

static void cpu_model(char *out, size_t size)
{
    snprintf(out, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(out, size, "%s", colon);
        break;
    }
    fclose(f);
}

/* "13000" -> "13.0" (CUDA's major*1000 + minor*10). */
static void cuda_version_str(int v, char *out, size_t size)
{
    if (v <= 0) snprintf(out, size, "none");
    else snprintf(out, size, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* cuDNN 9: major*10000 + minor*100 + patch. */
static void cudnn_version_str(int v, char *out, size_t size)
{
    if (v <= 0) snprintf(out, size, "none");
    else if (v >= 90000) snprintf(out, size, "%d.%d.%d", v / 10000, (v % 10000) / 100, v % 100);
    else snprintf(out, size, "%d.%d.%d", v / 1000, (v % 1000) / 100, v % 100);
}

/* cuBLASLt: major*10000 + minor*100 + patch (cublasLtGetVersion). */
static void cublaslt_version_str(int v, char *out, size_t size)
{
    if (v <= 0) snprintf(out, size, "none");
    else snprintf(out, size, "%d.%d.%d", v / 10000, (v % 10000) / 100, v % 100);
}

json_t *fp4d_env_to_json(void)
{
    json_t *j = json_object();
    char buf[1024];
    json_object_set_new(j, "fp4doctor_version", json_string(fp4d_version_string()));
    struct utsname u;
    if (uname(&u) == 0) {
        snprintf(buf, sizeof buf, "%s %s %s", u.sysname, u.release, u.machine);
        json_object_set_new(j, "os", json_string(buf));
    }
    json_t *cpu = json_object();
    cpu_model(buf, sizeof buf);
    json_object_set_new(cpu, "model", json_string(buf));
    json_object_set_new(cpu, "cores", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    json_t *feats = json_array();
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) json_array_append_new(feats, json_string("avx2"));
    if (__builtin_cpu_supports("fma")) json_array_append_new(feats, json_string("fma"));
    {
        /* clang 14's __builtin_cpu_supports has no "f16c": ask CPUID leaf 1 (ECX bit 29). */
        unsigned a, b, c, d;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29))) json_array_append_new(feats, json_string("f16c"));
    }
    if (__builtin_cpu_supports("avx512f")) json_array_append_new(feats, json_string("avx512f"));
    if (__builtin_cpu_supports("avx512bw")) json_array_append_new(feats, json_string("avx512bw"));
#endif
    json_object_set_new(cpu, "features", feats);
    json_object_set_new(j, "cpu", cpu);

    fp4d_cuda_info ci;
    fp4d_cuda_query(&ci);
    json_t *cuda = json_object();
    json_object_set_new(cuda, "built_with_cuda", json_boolean(ci.built_with_cuda));
    json_object_set_new(cuda, "built_archs", json_string(ci.built_archs));
    cuda_version_str(ci.driver_version, buf, sizeof buf);
    json_object_set_new(cuda, "driver", json_string(buf));
    cuda_version_str(ci.runtime_version, buf, sizeof buf);
    json_object_set_new(cuda, "runtime", json_string(buf));
    cublaslt_version_str(ci.cublaslt_version, buf, sizeof buf);
    json_object_set_new(cuda, "cublaslt", json_string(buf));
    cudnn_version_str(ci.cudnn_version, buf, sizeof buf);
    json_object_set_new(cuda, "cudnn", json_string(buf));
    json_object_set_new(cuda, "error", json_string(ci.error));
    json_object_set_new(j, "cuda", cuda);

    json_t *gpus = json_array();
    json_t *warnings = json_array();
    for (int i = 0; i < ci.device_count && i < FP4D_MAX_GPUS; i++) {
        const fp4d_gpu_info *g = &ci.gpus[i];
        json_t *gj = json_object();
        json_object_set_new(gj, "index", json_integer(g->index));
        json_object_set_new(gj, "name", json_string(g->name));
        snprintf(buf, sizeof buf, "%d.%d", g->cc_major, g->cc_minor);
        json_object_set_new(gj, "compute_capability", json_string(buf));
        json_object_set_new(gj, "memory_bytes", json_integer((json_int_t)g->total_mem_bytes));
        json_object_set_new(gj, "sm_count", json_integer(g->sm_count));
        json_object_set_new(gj, "pci_bus_id", json_string(g->pci_bus_id));
        json_object_set_new(gj, "native_code", json_boolean(g->has_native_code));
        json_object_set_new(gj, "ptx_jit", json_boolean(g->runs_from_ptx));
        json_array_append_new(gpus, gj);
        if (g->runs_from_ptx) {
            char older[160] = "";
            if (ci.driver_version > 0 && ci.driver_version < ci.runtime_version)
                snprintf(older, sizeof older, " (the driver, %d.%d, is older than the toolkit that wrote the PTX, %d.%d: "
                         "it may refuse to compile it)", ci.driver_version / 1000, ci.driver_version % 1000 / 10,
                         ci.runtime_version / 1000, ci.runtime_version % 1000 / 10);
            snprintf(buf, sizeof buf,
                     "GPU %d (%s, sm_%d%d) has no native code in this build (built: %s): the kernels "
                     "JIT-compile from PTX at first use%s, cached by the driver afterwards, and run "
                     "without the arch-specific paths; rebuild with FP4D_CUDA_ARCHS including it",
                     g->index, g->name, g->cc_major, g->cc_minor, ci.built_archs, older);
            json_array_append_new(warnings, json_string(buf));
        } else if (g->code_unknown) {
            snprintf(buf, sizeof buf,
                     "GPU %d (%s, sm_%d%d): whether this build has code for it cannot be read from its "
                     "architectures (built: %s); `fp4doctor check` shows whether the GPU backends run",
                     g->index, g->name, g->cc_major, g->cc_minor, ci.built_archs);
            json_array_append_new(warnings, json_string(buf));
        } else if (!g->has_native_code) {
            snprintf(buf, sizeof buf,
                     "GPU %d (%s, sm_%d%d) has no code in this build (built: %s): the cuda and "
                     "cublas-bf16 backends are UNSUPPORTED there; rebuild with FP4D_CUDA_ARCHS including it",
                     g->index, g->name, g->cc_major, g->cc_minor, ci.built_archs[0] ? ci.built_archs : "none");
            json_array_append_new(warnings, json_string(buf));
        }
        if (g->cc_major < 10) {
            snprintf(buf, sizeof buf,
                     "GPU %d (%s, sm_%d%d) has no FP4 tensor cores (Blackwell sm_100/sm_120 and "
                     "later): FP4 GEMMs there are emulated", g->index, g->name, g->cc_major, g->cc_minor);
            json_array_append_new(warnings, json_string(buf));
        }
    }
    json_object_set_new(j, "gpus", gpus);
    if (ci.device_count == 0) {
        snprintf(buf, sizeof buf, "no GPU found: %s; only the CPU backends can be checked",
                 ci.error[0] ? ci.error : "no CUDA device");
        json_array_append_new(warnings, json_string(buf));
    }
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        json_array_append_new(warnings, json_string("this CPU lacks AVX2/FMA: the cpu backend uses its portable (slower) path"));
#endif
    json_object_set_new(j, "warnings", warnings);
    return j;
}

fp4d_status fp4d_env_write_json(FILE *f)
{
    json_t *j = fp4d_env_to_json();
    FP4D_RETURN_ERROR_IF(!j, NOMEM, "out of memory");
    int rc = json_dumpf(j, f, JSON_INDENT(2));
    json_decref(j);
    fputc('\n', f);
    FP4D_RETURN_ERROR_IF(rc != 0, IO, "cannot write the environment");
    return FP4D_STATUS_OK;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

fp4d_status fp4d_env_write_text(FILE *f)
{
    json_t *j = fp4d_env_to_json();
    FP4D_RETURN_ERROR_IF(!j, NOMEM, "out of memory");
    json_t *cpu = json_object_get(j, "cpu"), *cuda = json_object_get(j, "cuda");
    fprintf(f, "fp4doctor %s on %s\n", jstr(j, "fp4doctor_version"), jstr(j, "os"));
    fprintf(f, "CPU        %s, %lld cores, features:", jstr(cpu, "model"),
            (long long)json_integer_value(json_object_get(cpu, "cores")));
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(cpu, "features"), i, v) fprintf(f, " %s", json_string_value(v));
    fprintf(f, "\nCUDA       built %s (archs %s), driver %s, runtime %s, cuBLASLt %s, cuDNN %s\n",
            json_is_true(json_object_get(cuda, "built_with_cuda")) ? "yes" : "no",
            jstr(cuda, "built_archs")[0] ? jstr(cuda, "built_archs") : "none", jstr(cuda, "driver"),
            jstr(cuda, "runtime"), jstr(cuda, "cublaslt"), jstr(cuda, "cudnn"));
    json_t *gpus = json_object_get(j, "gpus");
    if (json_array_size(gpus) == 0) fprintf(f, "GPUs       none\n");
    json_array_foreach(gpus, i, v) {
        fprintf(f, "GPU %-6lld %s, compute capability %s, %.1f GiB, %lld SMs, %s, native code: %s\n",
                (long long)json_integer_value(json_object_get(v, "index")), jstr(v, "name"),
                jstr(v, "compute_capability"),
                (double)json_integer_value(json_object_get(v, "memory_bytes")) / (1024.0 * 1024.0 * 1024.0),
                (long long)json_integer_value(json_object_get(v, "sm_count")), jstr(v, "pci_bus_id"),
                json_is_true(json_object_get(v, "native_code")) ? "yes"
                : json_is_true(json_object_get(v, "ptx_jit"))   ? "no (PTX, JIT-compiled)"
                                                                : "NO");
    }
    json_array_foreach(json_object_get(j, "warnings"), i, v) fprintf(f, "warning: %s\n", json_string_value(v));
    json_decref(j);
    return FP4D_STATUS_OK;
}
