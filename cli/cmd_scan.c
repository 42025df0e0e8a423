/*
 * cmd_scan.c - `fp4doctor scan` (checkpoint findings) and `fp4doctor replay` (one layer's
 * real weights through every backend). docs/cli.md, docs/scan.md.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_fp4_tensor.h"
#include "clock.h"
#include "fp4doctor/scan.h"
#include "scan/replay.h"

static void scan_usage(FILE *f)
{
    fprintf(f, "usage: fp4doctor scan PATH [--scales-only] [--tp N] [--verify-hashes] [--json FILE|-] [--threads N]\n\n"
               "Checks an NVFP4/MXFP4 checkpoint (a directory with config.json, hf_quant_config.json,\n"
               "model.safetensors.index.json and shards, or one .safetensors file): headers, index,\n"
               "companion tensors, dtypes, shapes, block and global scales, NaN/Inf, the quant\n"
               "config's exclusions, and which quantizer wrote it.\n\n"
               "  --scales-only  read only block-scale and global-scale tensors (~11%% of the bytes)\n"
               "  --json FILE|-  write the JSON report (docs/json-schema.md) to FILE or stdout\n"
               "  --tp N         judge each quantized linear's shard at tensor-parallel degree N (1..1024, 1: none):\n"
               "                 a K or N that N ranks cannot split, attention heads (config.json) they\n"
               "                 cannot share out, a scale block split between ranks, an NVFP4 K per\n"
               "                 rank that is not a multiple of 32 (vLLM #48898)\n"
               "  --verify-hashes\n"
               "                 sha256 of every file against its Hugging Face cache blob name\n"
               "                 (snapshots/REV/NAME -> blobs/SHA256) or a SHA256SUMS file beside it\n"
               "  --threads N    reader threads (default: one per CPU)\n\n"
               "exit: 0 no error finding, 1 an error finding, 2 usage, 3 PATH unreadable, 4 internal error\n");
}

typedef struct progress_state {
    double          start_s; /* fp4d_now_s() when the scan began */
    bool            drawn;
} progress_state;

/* A file of a checkpoint folder that the scan reads, by its name there. */
static bool read_by_scan(const char *name)
{
    size_t len = strlen(name);
    return (len > 12 && !strcmp(name + len - 12, ".safetensors")) || !strcmp(name, "config.json") ||
           !strcmp(name, "hf_quant_config.json") || !strcmp(name, "model.safetensors.index.json") ||
           !strcmp(name, "SHA256SUMS");
}

/* True when writing json_path would overwrite a file the scan reads: the checkpoint file itself,
 * or, inside a checkpoint directory, a shard or one of the config files. A new report file next
 * to the shards is fine. */
static bool json_would_overwrite_input(const char *json_path, const char *ckpt_path)
{
    if (cli_same_file(json_path, ckpt_path)) return true;
    char *dir_copy = strdup(json_path), *base_copy = strdup(json_path);
    bool  overwrites = false;
    if (dir_copy && base_copy && cli_same_file(dirname(dir_copy), ckpt_path)) overwrites = read_by_scan(basename(base_copy));
    free(dir_copy);
    free(base_copy);
    /* A report that exists already may be another name of a file the scan reads - a symbolic
     * or hard link made elsewhere - and is written through in place: it emptied that shard or
     * config before the scan read it, then held the report. Compared by identity with each
     * file of the checkpoint folder the scan reads. */
    struct stat report;
    DIR *d = !overwrites && stat(json_path, &report) == 0 ? opendir(ckpt_path) : NULL;
    for (struct dirent *e; d && !overwrites && (e = readdir(d));) {
        if (!read_by_scan(e->d_name)) continue;
        char *member = NULL;
        if (asprintf(&member, "%s/%s", ckpt_path, e->d_name) < 0) break;
        overwrites = cli_same_file(json_path, member);
        free(member);
    }
    if (d) closedir(d);
    return overwrites;
}

static void draw_progress(void *user, uint64_t done, uint64_t total)
{
    progress_state *ps = user;
    double s = fp4d_now_s() - ps->start_s;
    double frac = total ? (double)done / (double)total : 1.0;
    int width = 30, fill = (int)(frac * width);
    char bar[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r  scanning [%s] %5.1f%%  %.2f / %.2f GB  %.2f GB/s ", bar, 100.0 * frac, (double)done / 1e9,
            (double)total / 1e9, s > 0 ? (double)done / 1e9 / s : 0.0);
    fflush(stderr);
    ps->drawn = true;
}

int cmd_scan(int argc, char **argv)
{
    const char *cmd = argv[0], *path = NULL, *json_path = NULL;
    fp4d_scan_options opt = {0};
    bool end_of_options = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (end_of_options) {
            if (path) return cli_fail(FP4D_EXIT_USAGE, cmd, "one PATH only (got '%s' and '%s')", path, a);
            path = a;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            scan_usage(stdout);
            return FP4D_EXIT_OK;
        } else if (!strcmp(a, "--scales-only")) {
            opt.scales_only = true;
        } else if (!strcmp(a, "--json")) {
            if (++i >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "--json needs FILE or -");
            json_path = argv[i];
        } else if (!strcmp(a, "--threads")) {
            if (++i >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "--threads needs a number");
            uint64_t n;
            if (!cli_parse_u64(argv[i], &n) || n < 1 || n > 1024)
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--threads: '%s' is not a number in 1..1024", argv[i]);
            opt.threads = (int)n;
        } else if (!strcmp(a, "--verify-hashes")) {
            if (!fp4d_scan_hashes_available())
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--verify-hashes: this fp4doctor was built without OpenSSL's "
                                                      "libcrypto (install libssl-dev and rebuild)");
            opt.verify_hashes = true;
        } else if (!strcmp(a, "--tp")) {
            if (++i >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "--tp needs a number");
            uint64_t n;
            if (!cli_parse_u64(argv[i], &n) || n < 1 || n > 1024)
                return cli_fail(FP4D_EXIT_USAGE, cmd, "--tp: '%s' is not a number in 1..1024", argv[i]);
            opt.tensor_parallel = (int)n;
        } else if (!strcmp(a, "--")) {
            end_of_options = true; /* what follows is PATH, even if it begins with '-' */
        } else if (a[0] == '-' && a[1]) {
            return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see fp4doctor scan --help)", a);
        } else if (!path) {
            path = a;
        } else {
            return cli_fail(FP4D_EXIT_USAGE, cmd, "one PATH only (got '%s' and '%s')", path, a);
        }
    }
    if (!path) return cli_fail(FP4D_EXIT_USAGE, cmd, "expected a checkpoint PATH (see fp4doctor scan --help)");
    FILE *json_out = NULL;
    if (json_path) {
        if (!cli_path_is_stdout(json_path) && json_would_overwrite_input(json_path, path))
            return cli_fail(FP4D_EXIT_USAGE, cmd, "--json '%s' would overwrite a file of the checkpoint being scanned", json_path);
        /* Opened before the scan, so an unwritable path fails at once rather than after it. */
        json_out = cli_open_output(cmd, json_path);
        if (!json_out) return cli_output_failure();
    }
    const bool json_stdout = json_out == stdout;
    progress_state ps = {0};
    if (isatty(fileno(stderr))) {
        ps.start_s = fp4d_now_s();
        opt.progress = draw_progress;
        opt.progress_user = &ps;
    }
    fp4d_scan_report *rep = NULL;
    fp4d_status st = fp4d_scan_path(path, &opt, &rep);
    if (ps.drawn) fprintf(stderr, "\r%80s\r", "");
    if (st != FP4D_STATUS_OK) {
        int code = st == FP4D_STATUS_NOT_FOUND || st == FP4D_STATUS_IO || st == FP4D_STATUS_PARSE ? FP4D_EXIT_INPUT
                                                                                                 : FP4D_EXIT_INTERNAL;
        cli_discard_output(json_out); /* a previous report stays as it was */
        return cli_fail(code, cmd, "%s", fp4d_last_error());
    }
    int rc = fp4d_scan_report_count_at_least(rep, FP4D_SCAN_ERROR) ? FP4D_EXIT_FAILED : FP4D_EXIT_OK;
    if (!json_stdout) fp4d_scan_report_print(rep, stdout, cli_use_color(stdout));
    if (json_out) {
        char *text = NULL;
        if (fp4d_scan_report_json(rep, &text) != FP4D_STATUS_OK) {
            cli_discard_output(json_out);
            fp4d_scan_report_free(rep);
            return cli_fail(FP4D_EXIT_INTERNAL, cmd, "%s", fp4d_last_error());
        }
        fputs(text, json_out);
        fputc('\n', json_out);
        if (cli_close_output(json_out) != FP4D_EXIT_OK && rc == FP4D_EXIT_OK) rc = FP4D_EXIT_INPUT;
        free(text);
    }
    fp4d_scan_report_free(rep);
    return rc;
}

static void replay_usage(FILE *f)
{
    fprintf(f, "usage: fp4doctor replay CHECKPOINT --layer NAME [--backend LIST] [--rows M] [--seed S]\n"
               "                        [--tp N [--rank R]]\n\n"
               "Runs one quantized layer's real weights (NAME: the module, e.g.\n"
               "model.layers.0.mlp.experts.17.down_proj, or any of its tensors) through every\n"
               "available backend against the exact reference, with activations drawn at the scale\n"
               "its input scale implies, and prints the same verdicts as `fp4doctor check`.\n\n"
               "  --backend LIST  comma-separated backend names (default: all available)\n"
               "  --rows M        activation rows, 1..4096 (default 16)\n"
               "  --seed S        activation seed (default 1)\n"
               "  --tp N          replay one rank's shard at tensor-parallel degree N, 1..1024:\n"
               "                  down_proj, o_proj, ... split along K, other linears along N;\n"
               "                  q/k/v/o_proj and a fused qkv_proj by whole heads (config.json),\n"
               "                  a KV head whole on each rank that shares it; a fused\n"
               "                  gate_up_proj each rank's share of gate and of up\n"
               "  --rank R        which rank's shard, 0..N-1 (default 0)\n\n"
               "exit: 0 every backend PASS or UNSUPPORTED, 1 a failure, 2 usage, 3 unreadable input\n");
}

int cmd_replay(int argc, char **argv)
{
    const char *cmd = argv[0];
    fp4d_replay_options opt = {0};
    bool rank_given = false;
    opt.rows = 16;
    opt.seed = 1;
    bool end_of_options = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (end_of_options) {
            if (opt.checkpoint) return cli_fail(FP4D_EXIT_USAGE, cmd, "one CHECKPOINT only");
            opt.checkpoint = a;
        } else if (!strcmp(a, "--")) {
            end_of_options = true; /* what follows is CHECKPOINT, even if it begins with '-' */
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            replay_usage(stdout);
            return FP4D_EXIT_OK;
        } else if (!strcmp(a, "--layer")) {
            if (++i >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "--layer needs a NAME");
            opt.layer = argv[i];
        } else if (!strcmp(a, "--backend")) {
            if (++i >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "--backend needs a LIST");
            opt.backends = argv[i];
        } else if (!strcmp(a, "--rows") || !strcmp(a, "--seed")) {
            if (i + 1 >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "%s needs a number", a);
            uint64_t v;
            if (!cli_parse_u64(argv[i + 1], &v) || (!strcmp(a, "--rows") && (v < 1 || v > 4096)))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "%s: bad number '%s'", a, argv[i + 1]);
            if (!strcmp(a, "--rows")) opt.rows = (int64_t)v;
            else opt.seed = v;
            i++;
        } else if (!strcmp(a, "--tp") || !strcmp(a, "--rank")) {
            if (i + 1 >= argc) return cli_fail(FP4D_EXIT_USAGE, cmd, "%s needs a number", a);
            uint64_t v;
            const bool tp = !strcmp(a, "--tp");
            if (!cli_parse_u64(argv[i + 1], &v) || v > (tp ? 1024u : 1023u) || (tp && v < 1))
                return cli_fail(FP4D_EXIT_USAGE, cmd, "%s: '%s' is not a number in %s", a, argv[i + 1],
                                tp ? "1..1024" : "0..1023");
            if (tp) opt.tp = (int)v;
            else {
                opt.rank = (int)v;
                rank_given = true;
            }
            i++;
        } else if (a[0] == '-' && a[1]) {
            return cli_fail(FP4D_EXIT_USAGE, cmd, "unknown option '%s' (see fp4doctor replay --help)", a);
        } else if (!opt.checkpoint) {
            opt.checkpoint = a;
        } else {
            return cli_fail(FP4D_EXIT_USAGE, cmd, "one CHECKPOINT only");
        }
    }
    if (!opt.checkpoint || !opt.layer)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "expected CHECKPOINT and --layer NAME (see fp4doctor replay --help)");
    if (rank_given && opt.tp < 1)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "--rank needs --tp N (the rank of which split?)");
    if (opt.rank >= opt.tp && rank_given)
        return cli_fail(FP4D_EXIT_USAGE, cmd, "--rank %d is not a rank of --tp %d (0..%d)", opt.rank, opt.tp, opt.tp - 1);
    return fp4d_replay_run(&opt, stdout, cli_use_color(stdout));
}
