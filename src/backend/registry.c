/*
 * The backend registry, backend instances, `auto` and plugin loading (backend.h, plugin.h).
 *
 * The registry keeps its own copy of every iface (a plugin's struct may be smaller than
 * ours, and plugin names get a "plugin:" prefix), in a fixed array so that the pointers
 * fp4d_registry_get() hands out stay valid for the life of the process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "backend/backend_internal.h"
#include "backend/gpu_info.h"
#include "backend/verdict_cache.h"
#include "fp4doctor/plugin.h"
#include "fp4doctor/ref.h"
#include "env_knob.h"
#include "internal.h"
#include "out_elem.h"

#ifdef FP4D_USE_CUDA
#include "backend/cuda/cuda_backends.h"
#endif

enum { REGISTRY_MAX = 256 };

/* The v1 struct ends with the bench slot: a smaller struct_size cannot be a v1 iface. */
#define FP4D_IFACE_V1_SIZE (offsetof(fp4d_backend_iface, bench) + sizeof(((fp4d_backend_iface *)0)->bench))

/* Bytes of the iface that api_version v defines. When a version appends slots, add its end
 * here (FP4D_IFACE_V2_SIZE = offsetof + sizeof of its last slot): an iface is read up to
 * the smaller of this and its struct_size, never further, so an older plugin's smaller
 * struct never has whatever lies after it in memory read as function pointers. */
static size_t iface_size_of_version(uint32_t v)
{
    (void)v; /* only version 1 exists so far */
    return FP4D_IFACE_V1_SIZE;
}

typedef struct registry_entry {
    fp4d_backend_iface iface;
    char              *owned_name; /* "plugin:<name>" for plugins */
    void              *plugin;     /* dlopen handle that provided it, or NULL */
} registry_entry;

static registry_entry  registry[REGISTRY_MAX];
static size_t          registry_len;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t init_lock     = PTHREAD_MUTEX_INITIALIZER;

const char *fp4d_backend_kind_name(fp4d_backend_kind k)
{
    switch (k) {
    case FP4D_BACKEND_KIND_REFERENCE: return "reference";
    case FP4D_BACKEND_KIND_CPU: return "cpu";
    case FP4D_BACKEND_KIND_GPU: return "gpu";
    case FP4D_BACKEND_KIND_FAULTY: return "faulty";
    case FP4D_BACKEND_KIND_PLUGIN: return "plugin";
    default: return "unknown";
    }
}

static void reason_set(fp4d_reason *why, const char *fmt, ...) FP4D_PRINTF(2, 3);
static void reason_set(fp4d_reason *why, const char *fmt, ...)
{
    if (!why) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->text, sizeof why->text, fmt, ap);
    va_end(ap);
}

/*
 * fp4d_last_error() promises that successful calls leave it alone, but a successful call
 * of ours may run failing ones inside (an unavailable backend skipped by `auto`, a backend
 * that recovers from an error of its own): those save the caller's message first and put
 * it back when they succeed. The size is status.c's buffer.
 */
typedef struct error_saved {
    char text[1024];
} error_saved;

static void error_save(error_saved *e) { snprintf(e->text, sizeof e->text, "%s", fp4d_last_error()); }
static void error_restore(const error_saved *e) { (void)fp4d_set_error(FP4D_STATUS_OK, "%s", e->text); }

/*
 * Runs around every call into a backend's own code. A backend's failure must leave a
 * message in fp4d_last_error(), but a plugin cannot set one (it does not link
 * libfp4doctor), and a built-in backend whose worker thread failed set it in that thread:
 * without this the caller read a stale message from some earlier failure. A status that
 * is no fp4d_status (a plugin's -1) becomes INTERNAL, so that callers can switch on it.
 * Around a GPU backend it also gives the caller's current CUDA context back afterwards
 * (gpu_info.h); other kinds touch no CUDA, and the CUDA runtime is not even initialised for
 * them (the doctor's parent must open no context).
 */
typedef struct backend_call {
    const fp4d_backend_iface *iface;
    error_saved               errors;
    fp4d_cuda_thread_context  caller;
} backend_call;

static void backend_call_begin(backend_call *c, const fp4d_backend_iface *iface)
{
    c->iface = iface;
    if (iface->kind == FP4D_BACKEND_KIND_GPU) fp4d_cuda_thread_context_save(&c->caller);
    else c->caller.known = false;
    error_save(&c->errors);
    fp4d_clear_error();
}

/* For slots whose outcome is no failure to report (free, supports): the caller's last error
 * as it was. */
static void backend_call_end_quietly(const backend_call *c)
{
    if (c->caller.known) fp4d_cuda_thread_context_restore(&c->caller);
    error_restore(&c->errors);
}

static fp4d_status backend_call_end(const backend_call *c, fp4d_status st, const char *slot)
{
    if (c->caller.known) fp4d_cuda_thread_context_restore(&c->caller);
    if (st == FP4D_STATUS_OK) {
        error_restore(&c->errors);
        return st;
    }
    const char *backend = c->iface->name;
    if ((unsigned)st >= FP4D_STATUS_COUNT_) {
        error_saved said; /* the buffer being written cannot also be an argument */
        error_save(&said);
        return fp4d_set_error(FP4D_STATUS_INTERNAL, "backend %s: %s() returned %d, which is no fp4d_status%s%s",
                              backend, slot, (int)st, said.text[0] ? ": " : "", said.text);
    }
    if (!fp4d_last_error()[0])
        return fp4d_set_error(st, "backend %s: %s() failed: %s (the backend gave no reason)", backend, slot,
                              fp4d_status_str(st));
    return st;
}

static bool name_is_valid(const char *name)
{
    if (!name || !*name || strlen(name) > 64) return false;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-')) return false;
    return true;
}

static const registry_entry *find_locked(const char *name)
{
    for (size_t i = 0; i < registry_len; i++)
        if (!strcmp(registry[i].iface.name, name)) return &registry[i];
    return NULL;
}

/* Checks an iface and makes the registry's copy of it in *e, named prefix + iface->name
 * (the name malloc'ed when prefixed: entry_discard() frees it). Nothing is registered yet. */
static fp4d_status entry_build(const fp4d_backend_iface *iface, const char *prefix, void *plugin, registry_entry *e)
{
    memset(e, 0, sizeof *e);
    FP4D_RETURN_ERROR_IF(!iface, INVALID_ARG, "backend iface is NULL");
    FP4D_RETURN_ERROR_IF(iface->api_version == 0 || iface->api_version > FP4D_BACKEND_API_VERSION, INVALID_ARG,
                         "backend '%s': api_version %u is not supported (this fp4doctor speaks backend API v%d)",
                         iface->name ? iface->name : "?", iface->api_version, FP4D_BACKEND_API_VERSION);
    FP4D_RETURN_ERROR_IF(iface->struct_size < iface_size_of_version(iface->api_version), INVALID_ARG,
                         "backend '%s': struct_size %u is smaller than the v%u iface (%zu bytes)",
                         iface->name ? iface->name : "?", iface->struct_size, iface->api_version,
                         iface_size_of_version(iface->api_version));
    FP4D_RETURN_ERROR_IF(!name_is_valid(iface->name), INVALID_ARG,
                         "backend name '%s' is not [a-z0-9_-]+ (at most 64 characters)",
                         iface->name ? iface->name : "(null)");
    FP4D_RETURN_ERROR_IF(!iface->init || !iface->free || !iface->supports || !iface->gemm, INVALID_ARG,
                         "backend '%s': the mandatory slots init, free, supports and gemm must all be set",
                         iface->name);

    char *owned = NULL;
    if (prefix) {
        size_t len = strlen(prefix) + strlen(iface->name) + 1;
        owned      = malloc(len);
        FP4D_RETURN_ERROR_IF(!owned, NOMEM, "out of memory");
        snprintf(owned, len, "%s%s", prefix, iface->name);
    }
    /* Only the bytes both sides know: a larger struct's extra slots are not ours to read,
     * and an older, smaller one ends before our newer slots, which stay NULL. */
    size_t known = iface_size_of_version(iface->api_version);
    if (known > sizeof e->iface) known = sizeof e->iface;
    memcpy(&e->iface, iface, iface->struct_size < known ? iface->struct_size : known);
    e->iface.struct_size = sizeof e->iface;
    e->iface.name        = owned ? owned : iface->name;
    if (!e->iface.description) e->iface.description = "";
    /* Capabilities follow the slots actually present, whatever the flags claim. */
    e->iface.caps |= FP4D_CAP_GEMM;
    if (!e->iface.grouped_gemm) e->iface.caps &= ~(uint32_t)FP4D_CAP_GROUPED_GEMM;
    if (!e->iface.quantize) e->iface.caps &= ~(uint32_t)FP4D_CAP_QUANTIZE;
    if (plugin && e->iface.kind != FP4D_BACKEND_KIND_FAULTY) e->iface.kind = FP4D_BACKEND_KIND_PLUGIN;
    e->owned_name = owned;
    e->plugin     = plugin;
    return FP4D_STATUS_OK;
}

static void entry_discard(registry_entry *e)
{
    free(e->owned_name);
    e->owned_name = NULL;
}

/* Whether name is taken by a registered entry or by one of the n in staged. Caller holds
 * registry_lock. */
static bool name_taken_locked(const char *name, const registry_entry *staged, size_t n)
{
    if (find_locked(name)) return true;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(staged[i].iface.name, name)) return true;
    return false;
}

/*
 * Appends n built entries at once, or none of them (INVALID_ARG for a taken name or a full
 * registry). Entries are only ever appended, never moved or removed, so every pointer
 * fp4d_registry_get()/find() returned stays valid and means the same backend. On failure
 * the caller still owns the entries.
 */
static fp4d_status registry_append(registry_entry *entries, size_t n)
{
    fp4d_status st = FP4D_STATUS_OK;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < n && st == FP4D_STATUS_OK; i++)
        if (name_taken_locked(entries[i].iface.name, entries, i))
            st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "a backend named '%s' is already registered",
                                entries[i].iface.name);
    if (st == FP4D_STATUS_OK && n > REGISTRY_MAX - registry_len)
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "too many backends (at most %d)", REGISTRY_MAX);
    if (st == FP4D_STATUS_OK) {
        memcpy(&registry[registry_len], entries, n * sizeof *entries);
        registry_len += n;
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

fp4d_status fp4d_registry_add(const fp4d_backend_iface *iface)
{
    registry_entry e;
    FP4D_FORWARD_IF_ERROR(entry_build(iface, NULL, NULL, &e));
    return registry_append(&e, 1); /* unprefixed: no name of its own to free on failure */
}

size_t fp4d_registry_count(void)
{
    pthread_mutex_lock(&registry_lock);
    size_t n = registry_len;
    pthread_mutex_unlock(&registry_lock);
    return n;
}

const fp4d_backend_iface *fp4d_registry_get(size_t index)
{
    pthread_mutex_lock(&registry_lock);
    const fp4d_backend_iface *r = index < registry_len ? &registry[index].iface : NULL;
    pthread_mutex_unlock(&registry_lock);
    return r;
}

const fp4d_backend_iface *fp4d_registry_find(const char *name)
{
    if (!name) return NULL;
    pthread_mutex_lock(&registry_lock);
    const registry_entry *e = find_locked(name);
    pthread_mutex_unlock(&registry_lock);
    return e ? &e->iface : NULL;
}

/* ---- plugins ------------------------------------------------------------------------------- */

/*
 * One plugin being loaded. Its registrations are staged here and enter the registry
 * together once its init has returned success: while init runs, and if the plugin is
 * then refused, other threads never see its backends (before, they were registered one by
 * one and removed again on refusal, so another thread could hold a pointer to an entry
 * whose name was freed and whose code was dlclose'd, and entries registered meanwhile by
 * other threads moved under their pointers).
 */
typedef struct plugin_load {
    const char     *path;
    void           *handle;
    registry_entry *staged;
    size_t          registered, staged_cap;
    fp4d_status     first_error;
    char            error[512];
} plugin_load;

static void plugin_load_discard(plugin_load *pl)
{
    for (size_t i = 0; i < pl->registered; i++) entry_discard(&pl->staged[i]);
    free(pl->staged);
    pl->staged     = NULL;
    pl->registered = pl->staged_cap = 0;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int host_register_backend(const fp4d_plugin_host *host, const fp4d_backend_iface *iface)
{
    plugin_load *pl = host->host_data;
    const char  *prefix = "plugin:";
    /* A plugin that spelled the prefix itself is not punished for it. */
    fp4d_backend_iface copy;
    if (iface && iface->name && !strncmp(iface->name, prefix, strlen(prefix))) {
        memset(&copy, 0, sizeof copy);
        size_t n = iface->struct_size < sizeof copy ? iface->struct_size : sizeof copy;
        memcpy(&copy, iface, n);
        copy.name  = iface->name + strlen(prefix);
        iface      = &copy;
    }
    registry_entry e;
    fp4d_status    st = entry_build(iface, prefix, pl->handle, &e);
    if (st == FP4D_STATUS_OK) {
        /* a taken name is refused now, naming it, rather than when the plugin is done */
        pthread_mutex_lock(&registry_lock);
        if (name_taken_locked(e.iface.name, pl->staged, pl->registered))
            st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "a backend named '%s' is already registered", e.iface.name);
        pthread_mutex_unlock(&registry_lock);
    }
    if (st == FP4D_STATUS_OK && pl->registered == pl->staged_cap) {
        size_t          cap  = pl->staged_cap ? 2 * pl->staged_cap : 4;
        registry_entry *more = cap <= REGISTRY_MAX ? realloc(pl->staged, cap * sizeof *more) : NULL;
        if (!more) st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "too many backends (at most %d)", REGISTRY_MAX);
        else pl->staged = more, pl->staged_cap = cap;
    }
    if (st != FP4D_STATUS_OK) {
        entry_discard(&e);
        if (pl->first_error == FP4D_STATUS_OK) {
            pl->first_error = st;
            snprintf(pl->error, sizeof pl->error, "%s", fp4d_last_error());
        }
        return 1; /* the load fails with this reason (fp4d_plugin_load) */
    }
    pl->staged[pl->registered++] = e;
    return 0;
}

static void host_log(const fp4d_plugin_host *host, const char *message)
{
    plugin_load *pl = host->host_data;
    char line[1024];
    snprintf(line, sizeof line, "%s", message ? message : "(null)");
    fp4d_text_clean(line);
    fprintf(stderr, "fp4doctor: plugin %s: %s\n", base_name(pl->path), line);
}

typedef struct loaded_plugin {
    char *path;
    void *handle;
} loaded_plugin;

static loaded_plugin loaded_plugins[64];
static size_t        loaded_plugins_len;

/* In the trial child: accept every registration; the parent validates them for real. */
static int trial_register(const fp4d_plugin_host *host, const fp4d_backend_iface *iface)
{
    (void)host, (void)iface;
    return 0;
}

static void trial_log(const fp4d_plugin_host *host, const char *message) { (void)host, (void)message; }

/*
 * A plugin runs its constructors and fp4d_plugin_init() inside the loading process, before
 * the doctor can isolate anything. Load it first in a throw-away child, so that a plugin
 * that crashes or hangs while loading is an error naming it, not a crash of fp4doctor.
 * FP4DOCTOR_PLUGIN_TRIAL=0 skips this (e.g. under a debugger).
 */
static fp4d_status plugin_trial_load(const char *path)
{
    const char *env = getenv("FP4DOCTOR_PLUGIN_TRIAL");
    if (env && !strcmp(env, "0")) return FP4D_STATUS_OK;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return FP4D_STATUS_OK; /* cannot isolate: load it directly, as before */
    if (pid == 0) {
        /* The crash must kill this child: drop handlers inherited from the host program. */
        static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGALRM};
        for (size_t i = 0; i < FP4D_ARRAY_LEN(fatal); i++) signal(fatal[i], SIG_DFL);
        alarm(20);
        char rel[4096];
        snprintf(rel, sizeof rel, "%s%s", strchr(path, '/') ? "" : "./", path);
        void *h = dlopen(rel, RTLD_NOW | RTLD_LOCAL);
        if (!h) _exit(0); /* the parent reports dlopen's own message */
        union {
            void               *obj;
            fp4d_plugin_init_fn fn;
        } entry;
        entry.obj = dlsym(h, FP4D_PLUGIN_ENTRY_SYMBOL);
        if (entry.obj) {
            fp4d_plugin_host host = {.api_version = FP4D_BACKEND_API_VERSION,
                                     .register_backend = trial_register,
                                     .log = trial_log};
            (void)entry.fn(&host);
        }
        _exit(0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    /* A sanitizer build turns the crash into a report and exit(1); init itself never
     * exits the trial child (it ends with _exit(0)), so any other status is a crash too. */
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                              "plugin %s: crashed (exit status %d) while loading or in %s(); not loaded", path,
                              WEXITSTATUS(status), FP4D_PLUGIN_ENTRY_SYMBOL);
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        if (sig == SIGALRM)
            return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                                  "plugin %s: loading it or running %s() did not finish within 20 s", path,
                                  FP4D_PLUGIN_ENTRY_SYMBOL);
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                              "plugin %s: crashed (signal %d, %s) while loading or in %s(); not loaded", path, sig,
                              strsignal(sig), FP4D_PLUGIN_ENTRY_SYMBOL);
    }
    return FP4D_STATUS_OK;
}

fp4d_status fp4d_plugin_load(const char *path)
{
    FP4D_RETURN_ERROR_IF(!path || !*path, INVALID_ARG, "plugin path is empty");
    for (size_t i = 0; i < loaded_plugins_len; i++)
        if (!strcmp(loaded_plugins[i].path, path)) return FP4D_STATUS_OK; /* already loaded */
    FP4D_RETURN_ERROR_IF(loaded_plugins_len >= FP4D_ARRAY_LEN(loaded_plugins), INVALID_ARG,
                         "plugin %s: too many plugins (at most %zu)", path, FP4D_ARRAY_LEN(loaded_plugins));
    FP4D_RETURN_ERROR_IF(access(path, R_OK) != 0, NOT_FOUND, "plugin %s: cannot read the file: %s", path,
                         strerror(errno));
    FP4D_FORWARD_IF_ERROR(plugin_trial_load(path));
    /* dlopen searches the library path for names without a '/': a plugin is a file. */
    char *rel = NULL;
    if (!strchr(path, '/')) {
        rel = malloc(strlen(path) + 3);
        FP4D_RETURN_ERROR_IF(!rel, NOMEM, "out of memory");
        sprintf(rel, "./%s", path);
    }
    dlerror();
    void *h = dlopen(rel ? rel : path, RTLD_NOW | RTLD_LOCAL);
    free(rel);
    if (!h) {
        const char *e = dlerror();
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG, "plugin %s: cannot load it as a shared library: %s", path,
                              e ? e : "unknown error");
    }
    /* The same library under another spelling of its path (./x.so and /abs/x.so, or
     * --plugin plus FP4DOCTOR_PLUGINS): dlopen hands back the handle we already hold.
     * Running its init again would register its names twice and fail the whole load. */
    for (size_t i = 0; i < loaded_plugins_len; i++)
        if (loaded_plugins[i].handle == h) {
            dlclose(h); /* drops the reference this dlopen added */
            return FP4D_STATUS_OK;
        }
    union {
        void               *obj;
        fp4d_plugin_init_fn fn;
    } entry;
    dlerror();
    entry.obj = dlsym(h, FP4D_PLUGIN_ENTRY_SYMBOL);
    if (!entry.obj) {
        dlclose(h);
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG,
                              "plugin %s: no symbol %s (is it an fp4doctor plugin? see include/fp4doctor/plugin.h)",
                              path, FP4D_PLUGIN_ENTRY_SYMBOL);
    }
    plugin_load pl;
    memset(&pl, 0, sizeof pl);
    pl.path   = path;
    pl.handle = h;
    fp4d_plugin_host host = {
        .api_version      = FP4D_BACKEND_API_VERSION,
        .register_backend = host_register_backend,
        .log              = host_log,
        .host_data        = &pl,
    };
    int rc = entry.fn(&host);
    if (rc == 0 && pl.first_error == FP4D_STATUS_OK && pl.registered > 0 &&
        registry_append(pl.staged, pl.registered) != FP4D_STATUS_OK) {
        /* another thread took one of its names, or the last places, while init ran */
        pl.first_error = FP4D_STATUS_INVALID_ARG;
        snprintf(pl.error, sizeof pl.error, "%s", fp4d_last_error());
    }
    if (rc != 0 || pl.first_error != FP4D_STATUS_OK || pl.registered == 0) {
        plugin_load_discard(&pl);
        dlclose(h);
        if (pl.first_error != FP4D_STATUS_OK)
            return fp4d_set_error(pl.first_error, "plugin %s: %s", path, pl.error);
        if (rc != 0)
            return fp4d_set_error(FP4D_STATUS_INVALID_ARG, "plugin %s: %s() returned %d: the plugin refused to load",
                                  path, FP4D_PLUGIN_ENTRY_SYMBOL, rc);
        return fp4d_set_error(FP4D_STATUS_INVALID_ARG, "plugin %s: registered no backend", path);
    }
    free(pl.staged); /* the registry holds the entries now, names included */
    loaded_plugins[loaded_plugins_len].path   = strdup(path);
    loaded_plugins[loaded_plugins_len].handle = h;
    if (loaded_plugins[loaded_plugins_len].path) loaded_plugins_len++;
    return FP4D_STATUS_OK;
}

/* ---- initialisation ---------------------------------------------------------------------- */

/* FP4DOCTOR_INCLUDE_FAULTY=1 only: read as "not 0, false or no", a value such as "off" turned
 * the faulty backends on in silence, and `check` then failed (exit 1) on backends never asked
 * for. Anything but 0 or 1 is now ignored with a warning naming the variable. */
static bool faulty_from_env(void) { return fp4d_env_knob("FP4DOCTOR_INCLUDE_FAULTY", 0, 1, 0) == 1; }

/* FP4DOCTOR_DEBUG: anything but empty, 0, false or no (it only adds lines on stderr) */
static bool env_is_true(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0 && strcmp(v, "false") != 0 && strcmp(v, "no") != 0;
}

static bool builtins_registered, faulty_registered;
/* Set once the built-ins are in, read without init_lock by ensure_registry(): an atomic,
 * so that a thread that sees it also sees the entries. */
static atomic_bool builtins_done;

fp4d_status fp4d_registry_init(const fp4d_registry_options *opt)
{
    fp4d_status st = FP4D_STATUS_OK;
    pthread_mutex_lock(&init_lock);
    if (!builtins_registered) {
        builtins_registered = true;
        st = fp4d_registry_add(fp4d_ref_backend_iface());
        if (st == FP4D_STATUS_OK) st = fp4d_registry_add(fp4d_cpu_backend_iface());
#ifdef FP4D_USE_CUDA
        fp4d_cuda_register_backends();
#endif
        atomic_store(&builtins_done, true);
    }
    bool faulty = (opt && opt->include_faulty) || faulty_from_env();
    if (st == FP4D_STATUS_OK && faulty && !faulty_registered) {
        faulty_registered = true;
        for (size_t i = 0; i < fp4d_faulty_backend_count() && st == FP4D_STATUS_OK; i++)
            st = fp4d_registry_add(fp4d_faulty_backend_iface(i));
    }
    if (st == FP4D_STATUS_OK && opt && opt->num_plugins > 0 && !opt->plugin_paths)
        st = fp4d_set_error(FP4D_STATUS_INVALID_ARG, "registry: %zu plugins and no paths", opt->num_plugins);
    for (size_t i = 0; st == FP4D_STATUS_OK && opt && i < opt->num_plugins; i++)
        st = fp4d_plugin_load(opt->plugin_paths[i]);
    const char *env = getenv("FP4DOCTOR_PLUGINS");
    if (st == FP4D_STATUS_OK && env && *env) {
        char *list = strdup(env);
        if (!list) st = fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        for (char *save = NULL, *p = list ? strtok_r(list, ":", &save) : NULL; p && st == FP4D_STATUS_OK;
             p = strtok_r(NULL, ":", &save))
            st = fp4d_plugin_load(p);
        free(list);
    }
    pthread_mutex_unlock(&init_lock);
    return st;
}

/*
 * The lazy initialisation of fp4d_backend_open() and `auto`. It asks whether the built-ins
 * are registered, not whether the registry is empty: a program that registered its own
 * backend first, or a thread that ran while another was half-way through
 * fp4d_registry_init() (ref in, cpu not yet), saw a non-empty registry and then "no backend
 * named 'cpu'". fp4d_registry_init() takes init_lock, so a latecomer waits for all the
 * built-ins (not for FP4DOCTOR_PLUGINS, which a concurrent init may still be loading: a
 * plugin's backend is there once that init returns). A failure here (a broken FP4DOCTOR_PLUGINS entry) is not the caller's failure, and
 * the caller's call may succeed: its last error stays what it was.
 */
static void ensure_registry(void)
{
    if (atomic_load(&builtins_done)) return;
    error_saved saved;
    error_save(&saved);
    (void)fp4d_registry_init(NULL);
    error_restore(&saved);
}

/* ---- instances ------------------------------------------------------------------------------ */

struct fp4d_backend {
    const fp4d_backend_iface *iface;
    void                     *ctx;
    int                       device;
};

fp4d_status fp4d_backend_open(const char *name, int device, fp4d_backend_t *out, fp4d_reason *why)
{
    FP4D_RETURN_ERROR_IF(!out, INVALID_ARG, "fp4d_backend_open: out is NULL");
    *out = NULL;
    if (why) why->text[0] = '\0';
    ensure_registry();
    const fp4d_backend_iface *iface = fp4d_registry_find(name);
    if (!iface) {
        reason_set(why, "no backend named '%s' (see `fp4doctor backends`)", name ? name : "(null)");
        return fp4d_set_error(FP4D_STATUS_NOT_FOUND, "no backend named '%s'", name ? name : "(null)");
    }
    fp4d_reason local;
    local.text[0] = '\0';
    void       *ctx = NULL;
    backend_call call;
    backend_call_begin(&call, iface);
    fp4d_status st = backend_call_end(&call, iface->init(iface->user_data, device, &ctx, &local), "init");
    local.text[FP4D_REASON_MAX - 1] = '\0';
    fp4d_text_clean(local.text); /* a plugin's words go to terminals, JSON and XML */
    if (st != FP4D_STATUS_OK) {
        if (!local.text[0]) snprintf(local.text, sizeof local.text, "init failed: %s", fp4d_status_str(st));
        if (why) *why = local;
        return fp4d_set_error(st, "backend %s is unavailable: %s", iface->name, local.text);
    }
    fp4d_backend_t b = malloc(sizeof *b);
    if (!b) {
        backend_call_begin(&call, iface);
        iface->free(ctx);
        backend_call_end_quietly(&call);
        reason_set(why, "out of memory");
        return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    }
    b->iface  = iface;
    b->ctx    = ctx;
    b->device = device;
    *out      = b;
    return FP4D_STATUS_OK;
}

void fp4d_backend_close(fp4d_backend_t b)
{
    if (!b) return;
    backend_call call;
    backend_call_begin(&call, b->iface);
    b->iface->free(b->ctx);
    backend_call_end_quietly(&call);
    free(b);
}

const fp4d_backend_iface *fp4d_backend_iface_of(fp4d_backend_t b) { return b ? b->iface : NULL; }

int fp4d_backend_device(fp4d_backend_t b) { return b ? b->device : -1; }

bool fp4d_backend_supports(fp4d_backend_t b, const fp4d_gemm_desc *desc, fp4d_reason *why)
{
    if (!b || !desc) {
        reason_set(why, "no backend or no descriptor");
        return false;
    }
    if (desc->num_experts > 0 && !b->iface->grouped_gemm) {
        reason_set(why, "%s has no grouped (MoE) GEMM", b->iface->name);
        return false;
    }
    fp4d_reason local;
    local.text[0] = '\0';
    backend_call call;
    backend_call_begin(&call, b->iface);
    bool ok = b->iface->supports(b->ctx, desc, &local);
    backend_call_end_quietly(&call); /* "no" is an answer, not a failure: nothing to report */
    local.text[FP4D_REASON_MAX - 1] = '\0';
    fp4d_text_clean(local.text);
    if (!ok && !local.text[0]) snprintf(local.text, sizeof local.text, "%s does not support this problem", b->iface->name);
    if (why) *why = local;
    return ok;
}

/* What gemm and grouped_gemm do before their slot runs: the problem was validated (`valid`;
 * desc is filled only when it passed), and the backend must support what desc describes. OK
 * means run; otherwise the status to return, with *why set. */
static fp4d_status backend_accepts(fp4d_backend_t b, fp4d_status valid, const fp4d_gemm_desc *desc, fp4d_reason *why)
{
    if (valid != FP4D_STATUS_OK) {
        reason_set(why, "%s", fp4d_last_error());
        return valid;
    }
    fp4d_reason local;
    if (fp4d_backend_supports(b, desc, &local)) return FP4D_STATUS_OK;
    if (why) *why = local;
    return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "%s: %s", b->iface->name, local.text);
}

/* A slot's status through the call wrapper, its message in *why where it failed. */
static fp4d_status backend_ran(backend_call *call, fp4d_status st, const char *slot, fp4d_reason *why)
{
    st = backend_call_end(call, st, slot);
    if (st != FP4D_STATUS_OK) reason_set(why, "%s", fp4d_last_error());
    return st;
}

fp4d_status fp4d_backend_gemm(fp4d_backend_t b, const fp4d_gemm_problem *p, fp4d_reason *why)
{
    FP4D_RETURN_ERROR_IF(!b, INVALID_ARG, "backend is NULL");
    fp4d_gemm_desc desc;
    fp4d_status st = fp4d_gemm_validate(p);
    if (st == FP4D_STATUS_OK) fp4d_gemm_describe(p, &desc);
    st = backend_accepts(b, st, &desc, why);
    if (st != FP4D_STATUS_OK) return st;
    backend_call call;
    backend_call_begin(&call, b->iface);
    return backend_ran(&call, b->iface->gemm(b->ctx, p), "gemm", why);
}

fp4d_status fp4d_backend_grouped_gemm(fp4d_backend_t b, const fp4d_grouped_gemm_problem *p, fp4d_reason *why)
{
    FP4D_RETURN_ERROR_IF(!b, INVALID_ARG, "backend is NULL");
    fp4d_gemm_desc desc;
    fp4d_status st = fp4d_grouped_gemm_validate(p);
    if (st == FP4D_STATUS_OK) fp4d_grouped_gemm_describe(p, &desc);
    st = backend_accepts(b, st, &desc, why);
    if (st != FP4D_STATUS_OK) return st;
    backend_call call;
    backend_call_begin(&call, b->iface);
    return backend_ran(&call, b->iface->grouped_gemm(b->ctx, p), "grouped_gemm", why);
}

fp4d_status fp4d_backend_quantize(fp4d_backend_t b, fp4d_quantize_problem *q, fp4d_reason *why)
{
    FP4D_RETURN_ERROR_IF(!b || !q, INVALID_ARG, "backend or quantize problem is NULL");
    if (!b->iface->quantize) {
        reason_set(why, "%s has no quantizer", b->iface->name);
        return fp4d_set_error(FP4D_STATUS_UNSUPPORTED, "%s has no quantizer", b->iface->name);
    }
    /* the reference quantizer's checks first: a backend sees only a well-formed problem, as
     * gemm() does (fp4d_gemm_validate) */
    fp4d_status st = fp4d_quantize_check(&q->params, q->src_type, q->src, q->rows, q->cols, q->codes, q->scales);
    if (st == FP4D_STATUS_OK) {
        backend_call call;
        backend_call_begin(&call, b->iface);
        st = backend_call_end(&call, b->iface->quantize(b->ctx, q), "quantize");
    }
    if (st != FP4D_STATUS_OK) reason_set(why, "%s", fp4d_last_error());
    return st;
}

/* ---- auto -------------------------------------------------------------------------------- */

static bool auto_debug(void) { return env_is_true("FP4DOCTOR_DEBUG"); }

static void debugf(const char *fmt, ...) FP4D_PRINTF(1, 2);
static void debugf(const char *fmt, ...)
{
    if (!auto_debug()) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("fp4doctor auto: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Deterministic pseudo-random numbers for the validation problem (xorshift64*). */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

typedef struct validation_operand {
    fp4d_matrix m;
    void       *data;
    uint8_t    *scales;
    float      *dequant; /* [rows, k] exact values, for the error bound */
} validation_operand;

static void validation_operand_free(validation_operand *v)
{
    free(v->data), free(v->scales), free(v->dequant);
}

/* Random operand of type t and layout l with values that make an honest f32 kernel pass:
 * moderate scale bytes, random codes, activations of a few bits. */
static fp4d_status validation_operand_make(validation_operand *v, fp4d_dtype t, fp4d_scale_layout l, int64_t rows,
                                           int64_t k, uint64_t *rng)
{
    const fp4d_dtype_traits *tr = fp4d_dtype_get(t);
    memset(v, 0, sizeof *v);
    v->m.dtype        = t;
    v->m.rows         = rows;
    v->m.cols         = k;
    v->m.scale_layout = l;
    v->dequant        = malloc((size_t)(rows * k) * sizeof(float));
    v->data           = malloc(fp4d_dtype_data_bytes(t, rows, k));
    if (!v->dequant || !v->data) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
    if (tr->is_block_fp4) {
        int64_t sc = k / tr->block_size;
        size_t  sz = fp4d_scale_buffer_size(l, rows, sc);
        v->scales  = calloc(sz ? sz : 1, 1);
        if (!v->scales) return fp4d_set_error(FP4D_STATUS_NOMEM, "out of memory");
        uint8_t *codes = v->data;
        for (size_t i = 0; i < (size_t)(rows * k / 2); i++) codes[i] = (uint8_t)rng_next(rng);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < sc; c++) {
                /* e4m3 0x30..0x3F = 0.5 .. 1.875; ue8m0 125..129 = 1/4 .. 4 */
                uint8_t b = t == FP4D_DTYPE_NVFP4 ? (uint8_t)(0x30 + rng_next(rng) % 16) : (uint8_t)(125 + rng_next(rng) % 5);
                v->scales[fp4d_scale_offset(l, rows, sc, r, c)] = b;
            }
        v->m.scales = v->scales;
        FP4D_FORWARD_IF_ERROR(fp4d_dequantize(t, l, codes, v->scales, 1.0f, rows, k, v->dequant));
    } else {
        for (int64_t i = 0; i < rows * k; i++)
            v->dequant[i] = (float)((int)(rng_next(rng) % 33) - 16) / 8.0f; /* exact in bf16 and f16 */
        fp4d_from_f32(t, v->dequant, (size_t)(rows * k), v->data);
    }
    v->m.data = v->data;
    return FP4D_STATUS_OK;
}

/* One unit in the last place of x in type t: a generous allowance for the final
 * rounding(s) into the output type. */
static double ulp_of(fp4d_dtype t, double x)
{
    int mant_bits = t == FP4D_DTYPE_F32 ? 24 : t == FP4D_DTYPE_BF16 ? 8 : 11;
    double ax = fabs(x);
    if (ax < 1e-30) ax = 1e-30;
    int e;
    frexp(ax, &e);
    return ldexp(1.0, e - mant_bits);
}

/* Runs backend b on a small problem of desc's types and compares with the exact reference
 * within the f32-accumulation bound. Returns true when it agrees. */
static bool validate_against_reference(fp4d_backend_t b, const fp4d_gemm_desc *desc, char *msg, size_t msg_len)
{
    const int64_t m = 7, n = 40, k = 128; /* odd M and N: edge tiles on purpose */
    uint64_t           rng = 0x9E3779B97F4A7C15ULL;
    validation_operand va, vb;
    bool               ok = false;
    void              *out = NULL, *ref = NULL;
    memset(&va, 0, sizeof va), memset(&vb, 0, sizeof vb);
    if (validation_operand_make(&va, desc->a_type, desc->a_layout, m, k, &rng) != FP4D_STATUS_OK ||
        validation_operand_make(&vb, desc->b_type, desc->b_layout, n, k, &rng) != FP4D_STATUS_OK) {
        snprintf(msg, msg_len, "could not build a validation problem: %s", fp4d_last_error());
        goto done;
    }
    size_t esz = fp4d_out_elem_size(desc->out_type);
    out        = malloc((size_t)(m * n) * esz);
    ref        = malloc((size_t)(m * n) * esz);
    if (!out || !ref) {
        snprintf(msg, msg_len, "out of memory");
        goto done;
    }
    fp4d_gemm_problem p = {va.m, vb.m, 0.75f, desc->out_type, out};
    fp4d_gemm_desc    small;
    fp4d_gemm_describe(&p, &small);
    fp4d_reason why;
    if (!fp4d_backend_supports(b, &small, &why)) {
        snprintf(msg, msg_len, "cannot validate on a %lldx%lldx%lld problem: %.180s", (long long)m, (long long)n,
                 (long long)k, why.text);
        goto done;
    }
    memset(out, 0xFF, (size_t)(m * n) * esz); /* NaN poison: unwritten elements fail */
    if (fp4d_backend_gemm(b, &p, &why) != FP4D_STATUS_OK) {
        snprintf(msg, msg_len, "gemm failed: %.200s", why.text[0] ? why.text : fp4d_last_error());
        goto done;
    }
    p.out = ref;
    if (fp4d_ref_gemm(&p) != FP4D_STATUS_OK) {
        snprintf(msg, msg_len, "reference failed: %s", fp4d_last_error());
        goto done;
    }
    const double u = ldexp(1.0, -24), gamma = (k * u) / (1 - k * u);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double abs_sum = 0.0, exact = 0.0;
            for (int64_t kk = 0; kk < k; kk++) {
                double prod = (double)va.dequant[i * k + kk] * (double)vb.dequant[j * k + kk];
                abs_sum += fabs(prod);
                exact += prod; /* exact: a few bits each, K = 128 */
            }
            exact *= 0.75;
            double got  = fp4d_out_elem_get(desc->out_type, out, i * n + j);
            double want = fp4d_out_elem_get(desc->out_type, ref, i * n + j);
            double bound = gamma * abs_sum * 0.75 + ulp_of(desc->out_type, exact) + ulp_of(FP4D_DTYPE_F32, exact);
            if (!(fabs(got - exact) <= bound)) {
                snprintf(msg, msg_len, "disagrees with the reference at [%lld, %lld]: %.9g, expected %.9g",
                         (long long)i, (long long)j, got, want);
                goto done;
            }
        }
    ok = true;
    snprintf(msg, msg_len, "agrees with the reference on a %lldx%lldx%lld problem", (long long)m, (long long)n,
             (long long)k);
done:
    validation_operand_free(&va);
    validation_operand_free(&vb);
    free(out), free(ref);
    return ok;
}

typedef struct auto_candidate {
    const fp4d_backend_iface *iface;
    int                       score;
    bool                      cached_pass;
    double                    gflops;
} auto_candidate;

static int candidate_cmp(const void *x, const void *y)
{
    const auto_candidate *a = x, *b = y;
    if (a->cached_pass != b->cached_pass) return a->cached_pass ? -1 : 1;
    if (a->cached_pass && a->gflops != b->gflops) return a->gflops > b->gflops ? -1 : 1;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return 0;
}

fp4d_status fp4d_backend_choose_auto(const fp4d_gemm_desc *desc, const char **name_out, fp4d_reason *why)
{
    FP4D_RETURN_ERROR_IF(!desc || !name_out, INVALID_ARG, "fp4d_backend_choose_auto: NULL argument");
    *name_out = NULL;
    /* no backend's supports() is asked to judge a shape that is no GEMM (m = n = -4 chose cpu) */
    FP4D_RETURN_ERROR_IF(desc->m < 0 || desc->n < 0 || desc->k < 0 || desc->m > FP4D_MAX_DIM || desc->n > FP4D_MAX_DIM ||
                             desc->k > FP4D_MAX_DIM || desc->num_experts < 0,
                         INVALID_ARG, "fp4d_backend_choose_auto: shape m %lld, n %lld, k %lld, %d experts",
                         (long long)desc->m, (long long)desc->n, (long long)desc->k, (int)desc->num_experts);
    ensure_registry();

    const char *forced = getenv("FP4DOCTOR_BACKEND");
    if (forced && *forced && strcmp(forced, "auto") != 0) {
        const fp4d_backend_iface *iface = fp4d_registry_find(forced);
        if (!iface) {
            reason_set(why, "FP4DOCTOR_BACKEND=%s names no registered backend", forced);
            return fp4d_set_error(FP4D_STATUS_NOT_FOUND, "FP4DOCTOR_BACKEND=%s names no registered backend", forced);
        }
        debugf("FP4DOCTOR_BACKEND=%s forces the choice", forced);
        reason_set(why, "forced by FP4DOCTOR_BACKEND");
        *name_out = iface->name;
        return FP4D_STATUS_OK;
    }

    /* Backends that cannot open here, or fail their validation, are skipped, each setting
     * the last error on the way; a choice made in the end is a success, which leaves the
     * caller's last error alone. */
    error_saved saved;
    error_save(&saved);
    size_t          count = fp4d_registry_count();
    auto_candidate *cand  = calloc(count ? count : 1, sizeof *cand);
    FP4D_RETURN_ERROR_IF(!cand, NOMEM, "out of memory");
    size_t ncand = 0;
    for (size_t i = 0; i < count; i++) {
        const fp4d_backend_iface *iface = fp4d_registry_get(i);
        if (iface->kind == FP4D_BACKEND_KIND_FAULTY) continue; /* never chosen */
        fp4d_backend_t b;
        fp4d_reason    r;
        if (fp4d_backend_open(iface->name, -1, &b, &r) != FP4D_STATUS_OK) {
            debugf("%s: unavailable (%s)", iface->name, r.text);
            continue;
        }
        /* No score slot: never picked (backend.h: 0 = do not pick). */
        int score = 0;
        if (!fp4d_backend_supports(b, desc, &r)) {
            debugf("%s: does not support this problem (%s)", iface->name, r.text);
            fp4d_backend_close(b);
            continue;
        }
        if (iface->score) {
            /* like every other slot: the caller's last error and CUDA context kept */
            backend_call call;
            backend_call_begin(&call, iface);
            score = iface->score(b->ctx, desc);
            backend_call_end_quietly(&call);
        }
        fp4d_backend_close(b);
        if (score <= 0) {
            debugf("%s: score %d, not picked", iface->name, score);
            continue;
        }
        fp4d_cached_verdict v;
        /* The doctor files host backends under device -1 and GPU backends under the
         * device it checked; `auto` runs on the default device. */
        bool cached = fp4d_verdict_cache_get(iface->name, -1, &v) ||
                      ((iface->caps & FP4D_CAP_NEEDS_DEVICE) && fp4d_verdict_cache_get(iface->name, 0, &v));
        if (cached && strcmp(v.verdict, "PASS") != 0) {
            debugf("%s: excluded, cached verdict %s (suite %s)", iface->name, v.verdict, v.suite);
            continue;
        }
        cand[ncand].iface       = iface;
        cand[ncand].score       = score;
        cand[ncand].cached_pass = cached;
        cand[ncand].gflops      = cached ? v.gflops : 0.0;
        debugf("%s: candidate, score %d, %s", iface->name, score,
               cached ? "cached PASS" : "no cached verdict");
        ncand++;
    }
    qsort(cand, ncand, sizeof *cand, candidate_cmp);

    fp4d_status st = FP4D_STATUS_UNSUPPORTED;
    for (size_t i = 0; i < ncand; i++) {
        const fp4d_backend_iface *iface = cand[i].iface;
        if (!cand[i].cached_pass && iface->kind != FP4D_BACKEND_KIND_REFERENCE) {
            /* No verdict from the doctor for this one: check it ourselves before trusting it. */
            fp4d_backend_t b;
            fp4d_reason    r;
            char           msg[FP4D_REASON_MAX];
            if (fp4d_backend_open(iface->name, -1, &b, &r) != FP4D_STATUS_OK) continue;
            bool good = validate_against_reference(b, desc, msg, sizeof msg);
            fp4d_backend_close(b);
            debugf("%s: validation: %s", iface->name, msg);
            if (!good) continue;
            reason_set(why, "highest score (%d) among available backends; %s", cand[i].score, msg);
        } else if (cand[i].cached_pass) {
            reason_set(why, "cached PASS from the doctor%s", cand[i].gflops > 0 ? ", fastest measured" : "");
        } else {
            reason_set(why, "the exact reference: nothing faster qualified");
        }
        debugf("chose %s", iface->name);
        *name_out = iface->name;
        st        = FP4D_STATUS_OK;
        break;
    }
    free(cand);
    if (st != FP4D_STATUS_OK) {
        reason_set(why, "no registered backend supports this problem");
        return fp4d_set_error(st, "auto: no registered backend supports this problem");
    }
    error_restore(&saved);
    return FP4D_STATUS_OK;
}
