/*
 * The doctor's verdict cache (verdict_cache.h, DESIGN.md §7).
 *
 * One JSON file per machine fingerprint, so a driver upgrade, a new GPU or a new
 * fp4doctor build silently starts from an empty cache instead of trusting verdicts that
 * were measured under different software:
 *
 *   $XDG_CACHE_HOME/fp4doctor/verdicts-<16 hex digits of FNV-1a(fingerprint)>.json
 *   {
 *     "schema_version": 1,
 *     "fingerprint": "fp4doctor 0.1.0 (build ...); driver 13000; runtime 13000; ...",
 *     "entries": { "cpu@host": {"verdict": "PASS", "suite": "default", "gflops": 12.5},
 *                  "cublaslt@0": {...} }
 *   }
 *
 * The fingerprint string is stored in the file too, so a hash collision is detected and
 * treated as "no cache". Writes are read-modify-write of the whole file into a temporary
 * file in the same directory, fsync'd and renamed over the old one: a reader sees either
 * the old or the new file, never half of one. Two concurrent writers can lose one of
 * their updates (last rename wins); that costs a re-validation, never a wrong verdict.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/gpu_info.h"
#include "backend/verdict_cache.h"
#include "replace_file.h"
#include "internal.h"

#define FP4D_CACHE_SCHEMA_VERSION 1

static bool cache_disabled_by_call;
static char cache_path[4096];
static char cache_fingerprint[2048];

void fp4d_verdict_cache_disable(bool disabled) { cache_disabled_by_call = disabled; }

static bool cache_disabled(void)
{
    if (cache_disabled_by_call) return true;
    const char *e = getenv("FP4DOCTOR_NO_CACHE");
    return e && e[0] && strcmp(e, "0") != 0;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Everything that can change a backend's numerics on this machine. The build id is the
 * library's compile date and time: two builds of the same version may carry different
 * kernels, and a rebuild must not inherit verdicts measured on the old binary. */
static const char *build_fingerprint(void)
{
    if (cache_fingerprint[0]) return cache_fingerprint;
    fp4d_cuda_info ci;
    fp4d_cuda_query(&ci);
    int n = snprintf(cache_fingerprint, sizeof cache_fingerprint,
                     "fp4doctor %s (build %s %s); cuda %d; archs %s; driver %d; runtime %d; "
                     "cublaslt %d; cudnn %d",
                     fp4d_version_string(), __DATE__, __TIME__, ci.built_with_cuda ? 1 : 0,
                     ci.built_archs[0] ? ci.built_archs : "-", ci.driver_version,
                     ci.runtime_version, ci.cublaslt_version, ci.cudnn_version);
    for (int i = 0; i < ci.device_count && i < FP4D_MAX_GPUS && n > 0 &&
                    (size_t)n < sizeof cache_fingerprint;
         i++) {
        const fp4d_gpu_info *g = &ci.gpus[i];
        n += snprintf(cache_fingerprint + n, sizeof cache_fingerprint - (size_t)n,
                      "; gpu%d %s sm_%d%d %s", g->index, g->name, g->cc_major, g->cc_minor,
                      g->pci_bus_id);
    }
    return cache_fingerprint;
}

/* The directory: $XDG_CACHE_HOME/fp4doctor, else $HOME/.cache/fp4doctor. false if neither
 * variable is usable (then the cache is simply off). *made_from: the length of the part that
 * must exist already - $HOME, which the cache never creates (run as root with HOME pointing
 * at a directory that is not there, it made that home directory); 0 for XDG_CACHE_HOME, which
 * the XDG spec says to create when it is missing. */
static bool cache_dir(char *dir, size_t size, size_t *made_from)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    int n;
    if (xdg && xdg[0] == '/') { /* the XDG spec says relative paths are invalid: ignore */
        n = snprintf(dir, size, "%s/fp4doctor", xdg);
        if (made_from) *made_from = 0;
    } else {
        const char *home = getenv("HOME");
        if (!home || !home[0]) return false;
        n = snprintf(dir, size, "%s/.cache/fp4doctor", home);
        if (made_from) *made_from = strlen(home);
    }
    return n > 0 && (size_t)n < size;
}

const char *fp4d_verdict_cache_path(void)
{
    char dir[3800];
    if (!cache_dir(dir, sizeof dir, NULL)) {
        cache_path[0] = '\0';
        return cache_path;
    }
    snprintf(cache_path, sizeof cache_path, "%s/verdicts-%016llx.json", dir,
             (unsigned long long)fnv1a64(build_fingerprint()));
    return cache_path;
}

static void entry_key(const char *backend, int device, char *key, size_t size)
{
    if (device < 0) snprintf(key, size, "%s@host", backend);
    else snprintf(key, size, "%s@%d", backend, device);
}

/* Loads the file for this fingerprint; NULL when absent, unreadable, or for another
 * fingerprint. A corrupt file is treated as absent (it will be replaced on the next put). */
static json_t *cache_load(const char *path)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return NULL;
    json_t *fp = json_object_get(root, "fingerprint");
    json_t *entries = json_object_get(root, "entries");
    if (!json_is_string(fp) || strcmp(json_string_value(fp), build_fingerprint()) != 0 ||
        !json_is_object(entries) ||
        json_integer_value(json_object_get(root, "schema_version")) != FP4D_CACHE_SCHEMA_VERSION) {
        json_decref(root);
        return NULL;
    }
    return root;
}

bool fp4d_verdict_cache_get(const char *backend, int device, fp4d_cached_verdict *out)
{
    if (!backend || !out || cache_disabled()) return false;
    const char *path = fp4d_verdict_cache_path();
    if (!path[0]) return false;
    json_t *root = cache_load(path);
    if (!root) return false;
    char key[256];
    entry_key(backend, device, key, sizeof key);
    json_t *e = json_object_get(json_object_get(root, "entries"), key);
    bool found = false;
    if (json_is_object(e) && json_is_string(json_object_get(e, "verdict"))) {
        memset(out, 0, sizeof *out);
        snprintf(out->verdict, sizeof out->verdict, "%s",
                 json_string_value(json_object_get(e, "verdict")));
        const char *suite = json_string_value(json_object_get(e, "suite"));
        snprintf(out->suite, sizeof out->suite, "%s", suite ? suite : "");
        out->gflops = json_number_value(json_object_get(e, "gflops"));
        found = true;
    }
    json_decref(root);
    return found;
}

/* mkdir -p for the cache directory, below its first `keep` bytes, which must name an existing
 * directory. */
static fp4d_status ensure_dir(const char *dir, size_t keep)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    if (keep > 0) {
        tmp[keep] = '\0';
        struct stat sb;
        const int err = stat(tmp, &sb) != 0 ? errno : S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
        if (err) return fp4d_set_error(FP4D_STATUS_IO, "verdict cache: HOME '%s' is not usable: %s", tmp, strerror(err));
        tmp[keep] = dir[keep];
    }
    for (char *p = tmp + (keep > 0 ? keep : 1); *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (p > tmp + keep && mkdir(tmp, 0700) != 0 && errno != EEXIST)
            return fp4d_set_error(FP4D_STATUS_IO, "verdict cache: cannot create '%s': %s", tmp,
                                  strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return fp4d_set_error(FP4D_STATUS_IO, "verdict cache: cannot create '%s': %s", tmp,
                              strerror(errno));
    return FP4D_STATUS_OK;
}

static fp4d_status cache_put_locked(const char *path, const char *backend, int device, const fp4d_cached_verdict *v);

fp4d_status fp4d_verdict_cache_put(const char *backend, int device, const fp4d_cached_verdict *v)
{
    FP4D_RETURN_ERROR_IF(!backend || !v, INVALID_ARG, "verdict cache: NULL argument");
    if (cache_disabled()) return FP4D_STATUS_OK;
    char dir[3800];
    size_t keep = 0;
    FP4D_RETURN_ERROR_IF(!cache_dir(dir, sizeof dir, &keep), IO,
                         "verdict cache: neither XDG_CACHE_HOME nor HOME is set");
    FP4D_FORWARD_IF_ERROR(ensure_dir(dir, keep));
    const char *path = fp4d_verdict_cache_path();
    /* Read, merge, replace under an exclusive lock on PATH.lock: `check` runs of different
     * backends at once each read the file, added their entry and renamed their copy over it,
     * so all but the last one's entries were lost. Without a lock (none can be made) the
     * write is still atomic, only not merged. */
    char lock_path[4200];
    snprintf(lock_path, sizeof lock_path, "%s.lock", path);
    const int lock = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock >= 0)
        while (flock(lock, LOCK_EX) != 0 && errno == EINTR) {}
    fp4d_status st = cache_put_locked(path, backend, device, v);
    if (lock >= 0) close(lock); /* releases the lock */
    return st;
}

static fp4d_status cache_put_locked(const char *path, const char *backend, int device, const fp4d_cached_verdict *v)
{
    json_t *root = cache_load(path);
    if (!root) {
        root = json_pack("{s:i, s:s, s:{}}", "schema_version", FP4D_CACHE_SCHEMA_VERSION,
                         "fingerprint", build_fingerprint(), "entries");
        FP4D_RETURN_ERROR_IF(!root, NOMEM, "verdict cache: out of memory");
    }
    char key[256];
    entry_key(backend, device, key, sizeof key);
    json_t *entry = json_pack("{s:s, s:s, s:f}", "verdict", v->verdict, "suite", v->suite,
                              "gflops", v->gflops);
    if (!entry || json_object_set_new(json_object_get(root, "entries"), key, entry) != 0) {
        json_decref(root);
        return fp4d_set_error(FP4D_STATUS_NOMEM, "verdict cache: out of memory");
    }

    char *tmp = NULL;
    const int fd = fp4d_replace_begin(path, 0600, &tmp);
    if (fd < 0) {
        const int err = errno;
        json_decref(root);
        return fp4d_set_error(FP4D_STATUS_IO, "verdict cache: cannot write a temporary file beside '%s': %s", path,
                              strerror(err));
    }
    /* the write's own errno (a full disk says so), EIO where jansson failed without one */
    errno = 0;
    int err = json_dumpfd(root, fd, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 && write(fd, "\n", 1) == 1 ? 0
              : errno                                                                                  ? errno
                                                                                                       : EIO;
    json_decref(root);
    if (err == 0) err = fp4d_replace_commit(fd, tmp, path, true);
    else fp4d_replace_abort(fd, tmp);
    if (err) return fp4d_set_error(FP4D_STATUS_IO, "verdict cache: cannot replace '%s': %s", path, strerror(err));
    return FP4D_STATUS_OK;
}
