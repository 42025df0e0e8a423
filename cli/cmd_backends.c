/*
 * fp4doctor backends [--json] [--include-faulty] [--plugin PATH]... [--device N]
 *
 * Lists every registered backend, whether it can run here (init's answer, with the reason
 * when it cannot) and its properties. JSON schema: docs/json-schema.md, "## backends".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "fp4doctor/backend.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fp4doctor backends [--json] [--include-faulty] [--plugin PATH]... [--device N]\n\n"
            "Lists every backend: whether it is available on this machine (and why not), its kind,\n"
            "capabilities and description.\n\n"
            "  --json             machine-readable output on stdout (docs/json-schema.md)\n"
            "  --include-faulty   also list the deliberately broken faulty-* backends\n"
            "                     (FP4DOCTOR_INCLUDE_FAULTY=1 does the same)\n"
            "  --plugin PATH      load a plugin shared library (repeatable; FP4DOCTOR_PLUGINS=a.so:b.so)\n"
            "  --device N         GPU index to probe GPU backends on (default 0; host backends ignore it)\n");
}

static const struct {
    uint32_t    bit;
    const char *name;
} cap_names[] = {
    {FP4D_CAP_GEMM, "gemm"},
    {FP4D_CAP_GROUPED_GEMM, "grouped_gemm"},
    {FP4D_CAP_QUANTIZE, "quantize"},
    {FP4D_CAP_DEVICE_TIMING, "device_timing"},
    {FP4D_CAP_NEEDS_DEVICE, "needs_device"},
};

typedef struct backend_row {
    const fp4d_backend_iface *iface;
    bool                      available;
    int                       device; /* the device probed; -1 for host backends */
    char                      reason[FP4D_REASON_MAX];
} backend_row;

static void caps_text(uint32_t caps, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof cap_names / sizeof cap_names[0]; i++)
        if (caps & cap_names[i].bit) {
            if (buf[0]) strncat(buf, ",", len - strlen(buf) - 1);
            strncat(buf, cap_names[i].name, len - strlen(buf) - 1);
        }
}

static int print_json(const backend_row *rows, size_t n)
{
    json_t *root = json_object(), *list = json_array();
    json_object_set_new(root, "schema_version", json_integer(1));
    json_object_set_new(root, "command", json_string("backends"));
    json_object_set_new(root, "fp4doctor_version", json_string(fp4d_version_string()));
    for (size_t i = 0; i < n; i++) {
        const fp4d_backend_iface *f = rows[i].iface;
        json_t                   *o = json_object(), *caps = json_array();
        for (size_t c = 0; c < sizeof cap_names / sizeof cap_names[0]; c++)
            if (f->caps & cap_names[c].bit) json_array_append_new(caps, json_string(cap_names[c].name));
        json_object_set_new(o, "name", json_string(f->name));
        char desc[512]; /* a plugin's words: invalid UTF-8 made the JSON writer drop the key */
        json_object_set_new(o, "description", json_string(cli_shown(f->description, desc, sizeof desc)));
        json_object_set_new(o, "kind", json_string(fp4d_backend_kind_name(f->kind)));
        json_object_set_new(o, "caps", caps);
        json_object_set_new(o, "device", rows[i].device >= 0 ? json_integer(rows[i].device) : json_null());
        json_object_set_new(o, "available", json_boolean(rows[i].available));
        json_object_set_new(o, "reason", rows[i].available ? json_null() : json_string(rows[i].reason));
        json_object_set_new(o, "api_version", json_integer(f->api_version));
        json_array_append_new(list, o);
    }
    json_object_set_new(root, "backends", list);
    int rc = json_dumpf(root, stdout, JSON_INDENT(2)) == 0 ? FP4D_EXIT_OK : FP4D_EXIT_INTERNAL;
    fputc('\n', stdout);
    json_decref(root);
    return rc;
}

static void print_text(const backend_row *rows, size_t n)
{
    bool color = cli_use_color(stdout);
    printf("%-26s %-9s %-10s %-30s %s\n", "BACKEND", "KIND", "STATUS", "CAPS", "DESCRIPTION / WHY NOT");
    for (size_t i = 0; i < n; i++) {
        const fp4d_backend_iface *f = rows[i].iface;
        char                      caps[96];
        caps_text(f->caps, caps, sizeof caps);
        const char *status = rows[i].available ? "available" : "no";
        char        desc[512];
        cli_shown(f->description, desc, sizeof desc);
        printf("%-26s %-9s %s%-10s%s %-30s %s\n", f->name, fp4d_backend_kind_name(f->kind),
               color ? (rows[i].available ? "\033[32m" : "\033[33m") : "", status, color ? "\033[0m" : "", caps,
               rows[i].available ? desc : rows[i].reason);
    }
}

int cmd_backends(int argc, char **argv)
{
    const char *cmd     = argv[0];
    bool        json    = false, include_faulty = false;
    int         device  = 0;
    const char **plugins = calloc((size_t)argc + 1, sizeof *plugins);
    size_t      nplugins = 0;
    if (!plugins) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(plugins);
            return FP4D_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--include-faulty")) {
            include_faulty = true;
        } else if (!strcmp(a, "--plugin") || !strncmp(a, "--plugin=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || !*v) {
                free(plugins);
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--plugin needs a path (see --help)");
            }
            plugins[nplugins++] = v;
        } else if (!strcmp(a, "--device") || !strncmp(a, "--device=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            uint64_t    d;
            if (!v || !cli_parse_u64(v, &d) || d > 1023) {
                free(plugins);
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--device needs a GPU index >= 0 (see --help)");
            }
            device = (int)d;
        } else {
            free(plugins);
            return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see --help)", a);
        }
    }

    fp4d_registry_options ro = {include_faulty, plugins, nplugins};
    fp4d_status           st = fp4d_registry_init(&ro);
    free(plugins);
    if (st != FP4D_STATUS_OK) return cli_registry_failed(cmd, st);

    size_t       n    = fp4d_registry_count();
    backend_row *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows) return cli_fail(FP4D_EXIT_INTERNAL, cmd, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const fp4d_backend_iface *f = fp4d_registry_get(i);
        rows[i].iface              = f;
        rows[i].device             = (f->caps & FP4D_CAP_NEEDS_DEVICE) ? device : -1;
        fp4d_backend_t b;
        fp4d_reason    why;
        why.text[0] = '\0';
        rows[i].available = fp4d_backend_open(f->name, rows[i].device, &b, &why) == FP4D_STATUS_OK;
        if (rows[i].available) fp4d_backend_close(b);
        else snprintf(rows[i].reason, sizeof rows[i].reason, "%s", why.text[0] ? why.text : "init failed");
    }
    int rc = FP4D_EXIT_OK;
    if (json) rc = print_json(rows, n);
    else print_text(rows, n);
    free(rows);
    return rc;
}
