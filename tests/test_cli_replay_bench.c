/*
 * `fp4doctor replay` and `fp4doctor bench` run as a user runs them (the built binary,
 * $FP4DOCTOR_BIN) on checkpoints written here with the generator: bad --backend lists, names
 * that are not a layer, a layer whose block scales are NaN, the reference's time limit on
 * large layers, which files of a checkpoint are read (the index's shards, a stale copy beside
 * them, shards that cannot be read), a plugin that cannot be loaded; bench's host timing of
 * shapes too large for memory, its text (figures and the anchor of the ratios) and Ctrl-C in
 * the middle of a run.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "fp4doctor/io.h"
#include "fp4doctor/scan.h"
#include "scan/replay.h"
#include "test_util.h"

#define LAYER "model.layers.0.mlp.down_proj"

static char dir[256];
static const char *bin;

#define path_of(name) tu_path_in(dir, (name))
/* the CLI with a shell-quoted argument string; stdout/stderr to files in dir; the exit code */
#define run_cli(...) tu_run_cli(bin, dir, "", __VA_ARGS__)
/* the same with the address space capped at 2 GiB: a run that allocates more fails, where
 * without the cap it would take the machine's memory */
#define run_cli_capped(...) tu_run_cli(bin, dir, "ulimit -v 2097152;", __VA_ARGS__)
#define output_contains(which, needle) tu_output_contains(dir, (which), (needle))

static size_t output_size(const char *which)
{
    size_t n = 0;
    char *s = tu_slurp(path_of(which), &n);
    free(s);
    return s ? n : 0;
}

/* shards: 0 for the generator's default (2, with an index) */
static void generate_shards(const char *name, fp4d_ckpt_format format, int32_t experts, const fp4d_ckpt_plant *plant,
                            int32_t shards)
{
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, format);
    p.layers = 1;
    if (experts) p.experts = experts;
    if (shards) p.shards = shards;
    p.plants = plant;
    p.num_plants = plant ? 1 : 0;
    assert_int_equal(fp4d_ckpt_generate(path_of(name), &p), FP4D_STATUS_OK);
}

static void generate(const char *name, fp4d_ckpt_format format, int32_t experts, const fp4d_ckpt_plant *plant)
{
    generate_shards(name, format, experts, plant, 0);
}

/* A ModelOpt checkpoint (two shards, indexed) with a stale consolidated.safetensors beside its
 * shards holding every tensor again - the copy an earlier export left behind, which no loader
 * reads; LAYER's block scales NaN in the shards (indexed_nan) or in the stale copy (stale_nan). */
static void generate_with_stale_copy(const char *name, bool indexed_nan, bool stale_nan)
{
    const fp4d_ckpt_plant nan = {FP4D_DEFECT_SCALE_NAN, LAYER ".weight_scale", 3};
    char stale_src[64];
    snprintf(stale_src, sizeof stale_src, "%s.stale", name);
    generate(name, FP4D_CKPT_MODELOPT_NVFP4, 0, indexed_nan ? &nan : NULL);
    generate_shards(stale_src, FP4D_CKPT_MODELOPT_NVFP4, 0, stale_nan ? &nan : NULL, 1);
    char from[512], to[512];
    snprintf(from, sizeof from, "%s/model-00001-of-00001.safetensors", path_of(stale_src));
    snprintf(to, sizeof to, "%s/consolidated.safetensors", path_of(name));
    assert_int_equal(rename(from, to), 0);
}

/* Two copies of a one-shard ModelOpt checkpoint in one folder, model-00001-of-00001.safetensors
 * and consolidated.safetensors, placed in that order; the index names the healthy one for
 * every tensor, the other has LAYER's block scales NaN. Two such folders, the index naming one
 * file in the first and the other file in the second, tell "follows the index" from "takes
 * whichever file the directory lists first" whatever order the file system lists them in. */
static void generate_two_copies(const char *name, bool index_names_consolidated)
{
    const fp4d_ckpt_plant nan = {FP4D_DEFECT_SCALE_NAN, LAYER ".weight_scale", 3};
    char other[64];
    snprintf(other, sizeof other, "%s.other", name);
    generate_shards(name, FP4D_CKPT_MODELOPT_NVFP4, 0, index_names_consolidated ? &nan : NULL, 1);
    generate_shards(other, FP4D_CKPT_MODELOPT_NVFP4, 0, index_names_consolidated ? NULL : &nan, 1);
    char from[512], to[512];
    snprintf(from, sizeof from, "%s/model-00001-of-00001.safetensors", path_of(other));
    snprintf(to, sizeof to, "%s/consolidated.safetensors", path_of(name));
    assert_int_equal(rename(from, to), 0);
    if (!index_names_consolidated) return;
    char index[512];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path_of(name));
    json_t *root = json_load_file(index, 0, NULL);
    json_t *map = json_object_get(root, "weight_map");
    assert_true(json_object_size(map) > 0);
    const char *tensor;
    json_t *shard;
    json_object_foreach(map, tensor, shard) assert_int_equal(json_string_set(shard, "consolidated.safetensors"), 0);
    assert_int_equal(json_dump_file(root, index, 0), 0);
    json_decref(root);
}

/* The shard the checkpoint's index names for tensor. */
static const char *indexed_shard(const char *ckpt, const char *tensor)
{
    static char shard[256];
    char index[512];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path_of(ckpt));
    json_t *root = json_load_file(index, 0, NULL);
    if (!root && access(index, F_OK) != 0) return "model.safetensors"; /* one shard, no index */
    const char *s = json_string_value(json_object_get(json_object_get(root, "weight_map"), tensor));
    assert_non_null(s);
    snprintf(shard, sizeof shard, "%s", s);
    json_decref(root);
    return shard;
}

static int setup(void **state)
{
    (void)state;
    bin = tu_cli_binary();
    snprintf(dir, sizeof dir, "/tmp/fp4d_replay_bench_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    generate("mo", FP4D_CKPT_MODELOPT_NVFP4, 0, NULL);
    generate("oss", FP4D_CKPT_GPTOSS_MXFP4, 4, NULL);
    generate("oss1", FP4D_CKPT_GPTOSS_MXFP4, 1, NULL);
    const fp4d_ckpt_plant nan = {FP4D_DEFECT_SCALE_NAN, LAYER ".weight_scale", 1};
    generate("nan", FP4D_CKPT_MODELOPT_NVFP4, 0, &nan);
    const fp4d_ckpt_plant mxnan = {FP4D_DEFECT_SCALE_NAN, "model.layers.0.mlp.experts.down_proj_scales", 1};
    generate("mxnan", FP4D_CKPT_GPTOSS_MXFP4, 1, &mxnan);
    const fp4d_ckpt_plant plain = {FP4D_DEFECT_UNQUANTIZE, LAYER ".weight", 0};
    generate("plain", FP4D_CKPT_MODELOPT_NVFP4, 0, &plain);
    generate_two_copies("index_names_shard", false);
    generate_two_copies("index_names_consolidated", true);
    generate_with_stale_copy("stale_ok", true, false);
    const fp4d_ckpt_plant cut = {FP4D_DEFECT_TRUNCATE_SHARD, LAYER ".weight_scale", 0};
    generate("cut", FP4D_CKPT_MODELOPT_NVFP4, 0, &cut);
    const fp4d_ckpt_plant gone = {FP4D_DEFECT_DELETE_SHARD, LAYER ".weight_scale", 0};
    generate("gone", FP4D_CKPT_MODELOPT_NVFP4, 0, &gone);
    const fp4d_ckpt_plant moved = {FP4D_DEFECT_INDEX_WRONG_FILE, LAYER ".weight_scale", 0};
    generate("moved", FP4D_CKPT_MODELOPT_NVFP4, 0, &moved);
    /* folders of files without an index: a stale copy beside the shards, the shards alone, the
     * shards and a file that is no safetensors file */
    generate_with_stale_copy("dup", false, true);
    generate("unindexed", FP4D_CKPT_MODELOPT_NVFP4, 0, NULL);
    generate("junk", FP4D_CKPT_MODELOPT_NVFP4, 0, NULL);
    const char *no_index[] = {"dup", "unindexed", "junk"};
    for (size_t i = 0; i < 3; i++) {
        char index[512];
        snprintf(index, sizeof index, "%s/model.safetensors.index.json", path_of(no_index[i]));
        if (unlink(index)) return -1;
    }
    FILE *f = fopen(path_of("junk/extra.safetensors"), "w");
    if (!f || fputs("junk", f) < 0 || fclose(f)) return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_remove_tree(dir);
    return 0;
}

/* ---- replay -------------------------------------------------------------------------------- */

/* A --backend list with a name no backend has, or an empty item, is a usage error said before
 * anything runs; it was dropped in silence ("cpu,nope" ran cpu and exited 0). */
static void test_replay_backend_list_checked(void **state)
{
    (void)state;
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu,nope", path_of("mo")), 2);
    assert_true(output_contains("stderr.txt", "unknown backend 'nope'"));
    assert_int_equal(output_size("stdout.txt"), 0); /* no header, no verdicts: nothing ran */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu,faulty", path_of("mo")), 2);
    assert_true(output_contains("stderr.txt", "unknown backend 'faulty'"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu,", path_of("mo")), 2);
    assert_true(output_contains("stderr.txt", "empty name"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ,cpu", path_of("mo")), 2);
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu,ref,cpu", path_of("mo")), 2);
    assert_true(output_contains("stderr.txt", "names 'cpu' twice"));
    assert_int_equal(output_size("stdout.txt"), 0);
    assert_int_equal(run_cli("replay '%s' --layer ''", path_of("mo")), 2);
    /* a good list still runs, and a faulty backend named in it still fails */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu", path_of("mo")), 0);
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu,faulty-zeros", path_of("mo")), 1);
    assert_true(output_contains("stdout.txt", "ZEROS"));
}

/* A layer with a NaN block scale is an error for scan; replay said PASS and exited 0 because
 * the elements it touches are NaN in the exact result too and were skipped. */
static void test_replay_nan_block_scales_fail(void **state)
{
    (void)state;
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu", path_of("nan")), 1);
    assert_true(output_contains("stdout.txt", "1 of 512 block scales are NaN"));
    assert_true(output_contains("stdout.txt", "fp4doctor scan"));
    /* MXFP4 (ue8m0 0xFF), one fused expert */
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.experts.0.down_proj --backend cpu", path_of("mxnan")),
                     1);
    assert_true(output_contains("stdout.txt", "block scales are NaN"));
    /* the same layer without the defect passes */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu", path_of("mo")), 0);
    assert_false(output_contains("stdout.txt", "NaN"));
}

/* Names that are not a quantized layer get a message that leads somewhere. */
static void test_replay_layer_names(void **state)
{
    (void)state;
    /* partial: the layers whose names contain it */
    assert_int_equal(run_cli("replay '%s' --layer layers.0.mlp.down_proj", path_of("mo")), 3);
    assert_true(output_contains("stderr.txt", "contain it: " LAYER));
    assert_int_equal(run_cli("replay '%s' --layer down_proj", path_of("mo")), 3);
    assert_true(output_contains("stderr.txt", LAYER));
    /* excluded / stored bf16: not "no such layer" */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER, path_of("plain")), 3);
    assert_true(output_contains("stderr.txt", "is not quantized"));
    assert_true(output_contains("stderr.txt", "BF16"));
    /* an expert past the end of a fused tensor: says which exist */
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.experts.4.down_proj", path_of("oss")), 3);
    assert_true(output_contains("stderr.txt", "(0..3): there is no expert 4"));
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.experts.3.down_proj --backend cpu", path_of("oss")),
                     0);
    assert_true(output_contains("stdout.txt", "expert 3"));
    /* "-1" is no expert number: it ran expert 0 of a one-expert tensor and passed */
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.experts.-1.down_proj --backend cpu",
                             path_of("oss1")),
                     3);
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.experts.0.down_proj --backend cpu", path_of("oss1")),
                     0);
}

/* With model.safetensors.index.json, replay reads what a loader reads: the shards the index
 * names, each tensor from the shard the index names for it. It opened every .safetensors file
 * and took the first holder in directory order, so a stale consolidated.safetensors with NaN
 * block scales failed a healthy layer that scan passed, and a healthy stale copy hid a broken
 * indexed shard. */
static void test_replay_follows_the_index(void **state)
{
    (void)state;
    assert_int_equal(run_cli("scan '%s'", path_of("index_names_shard")), 0); /* scan follows the index too */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("index_names_shard")), 0);
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_false(output_contains("stdout.txt", "NaN"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("index_names_consolidated")), 0);
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_false(output_contains("stdout.txt", "NaN"));
    /* the indexed shards are broken, the stale copy healthy: the broken ones are replayed */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("stale_ok")), 1);
    assert_true(output_contains("stdout.txt", "3 of 512 block scales are NaN"));
    /* the stale file named as the checkpoint is one file: its own tensors are replayed */
    assert_int_equal(run_cli("replay '%s/consolidated.safetensors' --layer " LAYER " --backend ref",
                             path_of("index_names_shard")),
                     1);
    assert_true(output_contains("stdout.txt", "block scales are NaN"));
}

/* A shard the index names that cannot be read is an unreadable input (3) naming the file and
 * why; it was dropped in silence and the layer in it reported as "no quantized layer". */
static void test_replay_unreadable_indexed_shard(void **state)
{
    (void)state;
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("cut")), 3);
    assert_true(output_contains("stderr.txt", indexed_shard("cut", LAYER ".weight_scale")));
    assert_true(output_contains("stderr.txt", "TRUNCATED"));
    assert_false(output_contains("stderr.txt", "no quantized layer"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("gone")), 3);
    assert_true(output_contains("stderr.txt", indexed_shard("gone", LAYER ".weight_scale")));
    assert_true(output_contains("stderr.txt", "No such file"));
    assert_false(output_contains("stderr.txt", "no quantized layer"));
    /* the index names a shard that does not hold the tensor: said, not "no such layer" (nor the
     * copy in the other shard, which no loader reads, replayed) */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("moved")), 3);
    assert_true(output_contains("stderr.txt", "which does not hold it"));
    assert_true(output_contains("stderr.txt", indexed_shard("moved", LAYER ".weight_scale")));
}

/* Without an index, a tensor in two files is refused (which copy a loader reads is not known),
 * and a file that cannot be read is an error naming it (it could hold the layer); the first
 * holder in directory order was replayed, and an unreadable file dropped. */
static void test_replay_unindexed_files(void **state)
{
    (void)state;
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("dup")), 3);
    assert_true(output_contains("stderr.txt", "consolidated.safetensors"));
    assert_true(output_contains("stderr.txt", "is in both"));
    assert_int_equal(output_size("stdout.txt"), 0); /* no verdict from either copy */
    /* a folder of shards without an index still replays, but not past a file it cannot read */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("unindexed")), 0);
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("junk")), 3);
    assert_true(output_contains("stderr.txt", "extra.safetensors"));
    assert_int_equal(output_size("stdout.txt"), 0);
}

/* An index that is there but cannot be used is read by the same code as scan's
 * (scan_index_load): replay says why, as scan's HEADER_INVALID does, and reads every
 * .safetensors file of the folder instead, as scan does. */
static void test_replay_unusable_index(void **state)
{
    (void)state;
    char index[512];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", path_of("unindexed"));
    assert_int_equal(mkdir(index, 0755), 0);
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("unindexed")), 0);
    assert_true(output_contains("stderr.txt", "cannot use model.safetensors.index.json (not a regular file); "
                                              "reading every .safetensors file instead"));
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_int_equal(run_cli("scan '%s'", path_of("unindexed")), 1);
    assert_true(output_contains("stdout.txt", "HEADER_INVALID"));
    assert_int_equal(rmdir(index), 0);
    static const char *const bad[][2] = {
        {"{\"weight_map\": [", "expected near end of file"},
        {"{\"weight_map\": {\"x\": \"../x.safetensors\"}}", "needs a \"weight_map\" of tensor -> shard file name"},
    };
    for (size_t i = 0; i < 2; i++) {
        FILE *f = fopen(index, "w");
        assert_non_null(f);
        assert_true(fputs(bad[i][0], f) >= 0);
        assert_int_equal(fclose(f), 0);
        assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref", path_of("unindexed")), 0);
        assert_true(output_contains("stderr.txt", "cannot use model.safetensors.index.json ("));
        assert_true(output_contains("stderr.txt", bad[i][1]));
        assert_true(output_contains("stdout.txt", "PASS"));
    }
    assert_int_equal(unlink(index), 0);
}

/* Sets block scale (row, col) of a module's linear [rows x cols] scales to value, in the shard
 * the checkpoint's index names for it (the file is patched in place). */
static void set_block_scale(const char *ckpt, const char *module, int64_t row, int64_t col, uint8_t value)
{
    char tensor[256], file[512];
    snprintf(tensor, sizeof tensor, "%s.weight_scale", module);
    snprintf(file, sizeof file, "%s/%s", path_of(ckpt), indexed_shard(ckpt, tensor));
    FILE *f = fopen(file, "r+b");
    assert_non_null(f);
    uint8_t len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    char *header = calloc(hlen + 1, 1);
    assert_non_null(header);
    assert_int_equal(fread(header, 1, hlen, f), hlen);
    json_t *root = json_loads(header, 0, NULL);
    json_t *t = json_object_get(root, tensor);
    const int64_t cols = json_integer_value(json_array_get(json_object_get(t, "shape"), 1));
    const int64_t begin = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    assert_true(cols > col);
    assert_int_equal(fseek(f, (long)(8 + hlen + (uint64_t)begin + (uint64_t)(row * cols + col)), SEEK_SET), 0);
    assert_int_equal(fputc(value, f), value);
    assert_int_equal(fclose(f), 0);
    json_decref(root);
    free(header);
}

/* --tp N --rank R replays the shard rank R holds: a row-parallel layer (down_proj) its K / N
 * columns, others their N / N rows. A NaN block scale planted in one rank's part of each layer
 * makes that rank's shard broken and no other's, which says the right part was cut (the
 * verdicts alone would not: the reference runs on the same shard). */
static void test_replay_tensor_parallel_shard(void **state)
{
    (void)state;
    /* default generator: down_proj [64 x 128] (scales 64 x 8), gate_proj [128 x 64] (128 x 4) */
    generate("tp", FP4D_CKPT_MODELOPT_NVFP4, 0, NULL);
    set_block_scale("tp", LAYER, 5, 4, 0x7F);                      /* K 64..79: rank 1 of 2, rank 4 of 8 */
    set_block_scale("tp", "model.layers.0.mlp.gate_proj", 64, 0, 0xFF); /* row 64: rank 1 of 2 */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref,cpu --tp 2 --rank 0", path_of("tp")), 0);
    assert_true(output_contains("stdout.txt", "rank 0 of --tp 2: [64 x 64], split along K, row-parallel"));
    assert_false(output_contains("stdout.txt", "NaN"));
    assert_false(output_contains("stdout.txt", "note:"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref,cpu --tp 2 --rank 1", path_of("tp")), 1);
    assert_true(output_contains("stdout.txt", "1 of 256 block scales are NaN"));
    for (int rank = 3; rank <= 5; rank++) {
        assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend ref,cpu --tp 8 --rank %d", path_of("tp"), rank),
                         rank == 4);
        assert_true(output_contains("stdout.txt", "[64 x 16]"));
        assert_true(output_contains("stdout.txt", rank == 4 ? "1 of 64 block scales are NaN" : "PASS"));
        /* 16 columns per rank: each rank's scale rows end in a padded column (vLLM #48898) */
        assert_true(output_contains("stdout.txt", "note: each rank's K = 16 is not a multiple of 32"));
    }
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.gate_proj --backend ref,cpu --tp 2", path_of("tp")), 0);
    assert_true(output_contains("stdout.txt", "rank 0 of --tp 2: [64 x 64], split along its output rows N"));
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.gate_proj --backend cpu --tp 2 --rank 1",
                             path_of("tp")), 1);
    assert_true(output_contains("stdout.txt", "1 of 256 block scales are NaN"));
    /* without --tp the whole layer, its NaN scale in it */
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.mlp.gate_proj --backend cpu", path_of("tp")), 1);
    assert_true(output_contains("stdout.txt", "1 of 512 block scales are NaN"));
    /* shards engines refuse, and ranks that do not exist: usage errors, nothing run */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 3", path_of("tp")), 2);
    assert_true(output_contains("stderr.txt", "K = 128 cannot be split evenly between 3 tensor-parallel ranks"));
    assert_int_equal(output_size("stdout.txt"), 0);
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 16", path_of("tp")), 2);
    assert_true(output_contains("stderr.txt", "each rank holds K = 8, which splits a 16-element scale block"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 2 --rank 2", path_of("tp")), 2);
    assert_true(output_contains("stderr.txt", "--rank 2 is not a rank of --tp 2 (0..1)"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --rank 1", path_of("tp")), 2);
    assert_true(output_contains("stderr.txt", "--rank needs --tp"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 1 --rank 1", path_of("tp")), 2);
    assert_true(output_contains("stderr.txt", "--rank 1 is not a rank of --tp 1 (0..0)"));
    /* --tp 1 is the whole layer, and rank 0 its only rank */
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 1 --rank 0", path_of("tp")), 1);
    assert_true(output_contains("stdout.txt", "1 of 512 block scales are NaN"));
    assert_false(output_contains("stdout.txt", "shard"));
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 0", path_of("tp")), 2);
    assert_int_equal(run_cli("replay '%s' --layer " LAYER " --backend cpu --tp 1025", path_of("tp")), 2);
    /* scan --tp says the same of the same layers */
    assert_int_equal(run_cli("scan '%s' --tp 8", path_of("tp")), 1); /* the planted NaN scales */
    assert_true(output_contains("stdout.txt", "TP_SHARD"));
    assert_true(output_contains("stdout.txt", "at --tp 8 each rank holds K = 16, not a multiple of 32"));
}

/* Attention projections are cut by whole heads, as vLLM's QKVParallelLinear cuts them, when
 * config.json gives the heads. hidden 256, head_dim 16: 16 query heads (q_proj [256 x 256]),
 * 8 KV heads (k_proj [128 x 256]). At --tp 16 each rank holds one KV head of 16 rows, held
 * alike by two ranks; cut by rows it would hold 8. A NaN scale planted in row 34 (KV head 2)
 * therefore breaks ranks 4 and 5 both, and no other. Head counts no TP degree can share out
 * are refused, by replay and by scan, though the rows would divide. */
static void test_tensor_parallel_cuts_attention_by_head(void **state)
{
    (void)state;
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    p.layers = 1, p.hidden = 256, p.head_dim = 16, p.intermediate = 256;
    assert_int_equal(fp4d_ckpt_generate(path_of("heads"), &p), FP4D_STATUS_OK);
    const char *kproj = "model.layers.0.self_attn.k_proj";
    set_block_scale("heads", kproj, 34, 3, 0x7F);
    for (int rank = 3; rank <= 6; rank++) {
        assert_int_equal(run_cli("replay '%s' --layer %s --backend ref,cpu --tp 16 --rank %d", path_of("heads"), kproj,
                                 rank), rank == 4 || rank == 5);
        assert_true(output_contains("stdout.txt", "[16 x 256], KV head"));
        assert_true(output_contains("stdout.txt", rank / 2 == 2 ? "KV head 2 of 8 (rows 32..47), held alike by ranks 4..5"
                                                                : "(fewer KV heads than ranks)"));
        assert_true(output_contains("stdout.txt", rank / 2 == 2 ? "1 of 256 block scales are NaN" : "PASS"));
    }
    /* 8 KV heads at --tp 4: two heads per rank, by rows as before */
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 4 --rank 1", path_of("heads"), kproj), 1);
    assert_true(output_contains("stdout.txt", "rank 1 of --tp 4: [32 x 256], split along its output rows N"));
    /* 16 query heads cannot be shared by 32 ranks (the 256 rows could), 8 KV heads not by 12 (the
     * 128 rows could not either; the heads are what is said) */
    assert_int_equal(run_cli("replay '%s' --layer model.layers.0.self_attn.q_proj --backend cpu --tp 32",
                             path_of("heads")), 2);
    assert_true(output_contains("stderr.txt", "config.json gives num_attention_heads = 16, which 32 tensor-parallel "
                                              "ranks cannot share out (q_proj is cut by whole heads"));
    assert_int_equal(output_size("stdout.txt"), 0);
    assert_int_equal(run_cli("scan '%s' --tp 32", path_of("heads")), 1);
    assert_true(output_contains("stdout.txt", "o_proj.weight: config.json gives num_attention_heads = 16"));
    assert_false(output_contains("stdout.txt", "num_key_value_heads")); /* 8 KV heads, each on 4 of 32 ranks */
    /* 12 query heads and 6 KV heads (hidden 192) at --tp 4: the query heads share out, the KV
     * heads do not (6 is no multiple of 4, nor 4 of 6) */
    p.hidden = 192;
    assert_int_equal(fp4d_ckpt_generate(path_of("heads6"), &p), FP4D_STATUS_OK);
    assert_int_equal(run_cli("scan '%s' --tp 4", path_of("heads6")), 1);
    assert_true(output_contains("stdout.txt", "k_proj.weight: config.json gives num_key_value_heads = 6, which 4"));
    assert_true(output_contains("stdout.txt", "v_proj.weight: config.json gives num_key_value_heads = 6, which 4"));
    assert_false(output_contains("stdout.txt", "num_attention_heads"));
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 4", path_of("heads6"), kproj), 2);
    assert_true(output_contains("stderr.txt", "the KV heads must be a multiple of the TP degree, or the TP degree a "
                                              "multiple of them"));
    /* at --tp 16 the heads share out (the planted NaN scale is the one error) */
    assert_int_equal(run_cli("scan '%s' --tp 16 --json '%s'", path_of("heads"), path_of("heads.json")), 1);
    assert_false(output_contains("stdout.txt", "num_key_value_heads"));
    assert_false(output_contains("stdout.txt", "num_attention_heads"));
    /* k_proj alone at --tp 32: its 8 KV heads would go 4 ranks each, but q, k and v are one layer
     * to the engine, and its 16 query heads do not share out */
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 32", path_of("heads"), kproj), 2);
    assert_true(output_contains("stderr.txt", "num_attention_heads = 16, which 32"));

    /* config.json from someone else: a head_dim past 2^24 (whose products overflowed) is not
     * taken (hidden_size / heads is), and a FIFO is refused, not waited on: rows, with a note */
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/config.json", path_of("heads"));
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"num_attention_heads\": 16, \"num_key_value_heads\": 8, \"hidden_size\": 256, "
          "\"head_dim\": 4611686018427387936}", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 16 --rank 5", path_of("heads"), kproj), 1);
    assert_true(output_contains("stdout.txt", "KV head 2 of 8 (rows 32..47)"));
    assert_int_equal(unlink(cfg), 0);
    assert_int_equal(mkfifo(cfg, 0644), 0);
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 16 --rank 5", path_of("heads"), kproj), 0);
    assert_true(output_contains("stderr.txt", "cannot use config.json (not a regular file); attention projections "
                                              "are cut by rows"));
    assert_true(output_contains("stdout.txt", "rank 5 of --tp 16: [8 x 256], split along its output rows N"));
    assert_int_equal(unlink(cfg), 0);
}

/* A folder of one ModelOpt layer `module` of n x 64 (K = 64), with config.json holding `config`
 * (none when NULL). Row r's block scales are 0x30 + r % 8 (e4m3 0.25..0.4375), so a shard's
 * rows can be told apart; the codes are a fixed pattern. */
static void write_fused_layer(const char *name, const char *module, int64_t n, const char *config)
{
    const int64_t k = 64;
    assert_int_equal(mkdir(path_of(name), 0755), 0);
    char path[512];
    if (config) {
        snprintf(path, sizeof path, "%s/config.json", path_of(name));
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(config, f);
        assert_int_equal(fclose(f), 0);
    }
    uint8_t *codes = malloc((size_t)(n * k / 2)), *scales = malloc((size_t)(n * k / 16));
    assert_true(codes && scales);
    for (int64_t i = 0; i < n * k / 2; i++) codes[i] = (uint8_t)(0x21 + i % 5);
    for (int64_t r = 0; r < n; r++) memset(scales + r * (k / 16), 0x30 + (int)(r % 8), (size_t)(k / 16));
    const float one = 1.0f;
    const int64_t wshape[2] = {n, k / 2}, sshape[2] = {n, k / 16}, none[1] = {0};
    fp4d_st_writer *w = fp4d_st_writer_new();
    assert_non_null(w);
    char t[128];
    snprintf(t, sizeof t, "%s.weight", module);
    assert_int_equal(fp4d_st_writer_add(w, t, FP4D_ST_U8, 2, wshape, codes, (size_t)(n * k / 2)), FP4D_STATUS_OK);
    snprintf(t, sizeof t, "%s.weight_scale", module);
    assert_int_equal(fp4d_st_writer_add(w, t, FP4D_ST_F8_E4M3, 2, sshape, scales, (size_t)(n * k / 16)), FP4D_STATUS_OK);
    snprintf(t, sizeof t, "%s.weight_scale_2", module);
    assert_int_equal(fp4d_st_writer_add(w, t, FP4D_ST_F32, 0, none, &one, 4), FP4D_STATUS_OK);
    snprintf(t, sizeof t, "%s.input_scale", module);
    assert_int_equal(fp4d_st_writer_add(w, t, FP4D_ST_F32, 0, none, &one, 4), FP4D_STATUS_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", path_of(name));
    assert_int_equal(fp4d_st_writer_save(w, path), FP4D_STATUS_OK);
    fp4d_st_writer_free(w);
    free(codes);
    free(scales);
}

/* model.layers.0.self_attn.qkv_proj: q, k and v fused as Phi-3 and Phi-4 ship them ([q | k | v]
 * rows), q_heads and kv_heads of 16 rows, and a config.json giving those heads. */
static void write_fused_qkv(const char *name, int q_heads, int kv_heads)
{
    char config[256];
    snprintf(config, sizeof config,
             "{\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": 16, \"hidden_size\": %d}",
             q_heads, kv_heads, q_heads * 16);
    write_fused_layer(name, "model.layers.0.self_attn.qkv_proj", (int64_t)(q_heads + 2 * kv_heads) * 16, config);
}

/* A fused qkv_proj is cut as vLLM cuts it: each rank takes its query heads' rows and its KV
 * head's k and v rows, three ranges, and the heads must share out. Rows alone (384 % 4 == 0)
 * said nothing of 6 KV heads at --tp 4. */
static void test_tensor_parallel_fused_qkv(void **state)
{
    (void)state;
    const char *qkv = "model.layers.0.self_attn.qkv_proj";
    /* 8 query heads, 2 KV heads: at --tp 8 rank 5 holds query head 5 (rows 80..95) and KV head
     * 1, held by ranks 4..7: k rows 128 + 16..31, v rows 160 + 16..31 */
    write_fused_qkv("fused", 8, 2);
    assert_int_equal(run_cli("replay '%s' --layer %s --backend ref,cpu --tp 8 --rank 5", path_of("fused"), qkv), 0);
    assert_true(output_contains("stdout.txt", "rank 5 of --tp 8: [48 x 64], by heads: q rows 80..95, k rows "
                                              "144..159, v rows 176..191 (one KV head, held alike by several ranks)"));
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 2 --rank 1", path_of("fused"), qkv), 0);
    assert_true(output_contains("stdout.txt", "[96 x 64], by heads: q rows 64..127, k rows 144..159, v rows 176..191"));
    run_cli("scan '%s' --tp 8", path_of("fused")); /* (no quantization config: other findings) */
    assert_true(output_contains("stdout.txt", "quantized linear"));
    assert_false(output_contains("stdout.txt", "TP_SHARD"));
    /* 12 query heads, 6 KV heads at --tp 4: refused by both */
    write_fused_qkv("fused6", 12, 6);
    assert_int_equal(run_cli("scan '%s' --tp 4", path_of("fused6")), 1);
    assert_true(output_contains("stdout.txt", "qkv_proj.weight: config.json gives num_key_value_heads = 6, which 4"));
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 4", path_of("fused6"), qkv), 2);
    assert_true(output_contains("stderr.txt", "num_key_value_heads = 6, which 4 tensor-parallel ranks cannot share out"));
    run_cli("scan '%s' --tp 3", path_of("fused6")); /* 12 and 6 heads: 4 and 2 a rank */
    assert_true(output_contains("stdout.txt", "quantized linear"));
    assert_false(output_contains("stdout.txt", "TP_SHARD"));
}

/* A dense fused gate_up_proj ([gate | up] rows, Phi-3 and Phi-4-mini) is cut as vLLM's
 * MergedColumnParallelLinear cuts it: each rank takes its share of gate and its share of up.
 * Cut into contiguous rows, rank 0 of --tp 2 held gate alone, and a NaN scale in up's first
 * half was put on rank 1. 2 x 96 rows: at --tp 2, rank 0 holds gate rows 0..47 and up rows
 * 96..143, where the NaN scale of row 100 is. */
static void test_tensor_parallel_fused_gate_up(void **state)
{
    (void)state;
    const char *gate_up = "model.layers.0.mlp.gate_up_proj";
    write_fused_layer("gateup", gate_up, 192, NULL);
    set_block_scale("gateup", gate_up, 100, 2, 0x7F);
    assert_int_equal(run_cli("replay '%s' --layer %s --backend ref,cpu --tp 2 --rank 0", path_of("gateup"), gate_up), 1);
    assert_true(output_contains("stdout.txt", "rank 0 of --tp 2: [96 x 64], by parts: gate rows 0..47, up rows 96..143"));
    assert_true(output_contains("stdout.txt", "1 of 384 block scales are NaN"));
    assert_int_equal(run_cli("replay '%s' --layer %s --backend ref,cpu --tp 2 --rank 1", path_of("gateup"), gate_up), 0);
    assert_true(output_contains("stdout.txt", "by parts: gate rows 48..95, up rows 144..191"));
    assert_true(output_contains("stdout.txt", "PASS"));
    /* --tp 64: each half's 96 rows do not share out, though the 192 rows would divide by 64 */
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 64", path_of("gateup"), gate_up), 2);
    assert_true(output_contains("stderr.txt", "a fused gate_up_proj, whose gate and up halves of 96 rows each cannot be "
                                              "split evenly between 64 tensor-parallel ranks"));
    run_cli("scan '%s' --tp 64", path_of("gateup"));
    assert_true(output_contains("stdout.txt", "gate_up_proj.weight: a fused gate_up_proj, whose gate and up halves of "
                                              "96 rows each"));
    run_cli("scan '%s' --tp 32", path_of("gateup"));
    assert_false(output_contains("stdout.txt", "TP_SHARD"));
    /* a MoE's experts tensor of the same name keeps contiguous rows (gpt-oss interleaves gate and up) */
    const char *experts = "model.layers.0.mlp.experts.gate_up_proj";
    write_fused_layer("experts", experts, 192, NULL);
    assert_int_equal(run_cli("replay '%s' --layer %s --backend cpu --tp 2 --rank 1", path_of("experts"), experts), 0);
    assert_true(output_contains("stdout.txt", "rank 1 of --tp 2: [96 x 64], split along its output rows N"));
}

/* scan --json LINK, LINK a symbolic or hard link made outside the folder to one of its shards
 * or configs, wrote the report through the link: the shard was emptied before the scan read it
 * (FILE_TRUNCATED) and then held the report. Refused now, the files as they were. */
static void test_scan_report_never_overwrites_the_checkpoint(void **state)
{
    (void)state;
    generate("linked", FP4D_CKPT_MODELOPT_NVFP4, 0, NULL);
    char shard[512], config[512];
    snprintf(shard, sizeof shard, "%s/%s", path_of("linked"), indexed_shard("linked", LAYER ".weight"));
    snprintf(config, sizeof config, "%s/config.json", path_of("linked"));
    size_t shard_len = 0, config_len = 0;
    char *shard_before = tu_slurp(shard, &shard_len), *config_before = tu_slurp(config, &config_len);
    assert_non_null(shard_before);
    assert_non_null(config_before);
    assert_int_equal(symlink(shard, path_of("soft.json")), 0);
    assert_int_equal(link(config, path_of("hard.json")), 0);
    const char *reports[] = {"soft.json", "hard.json"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(run_cli("scan '%s' --json '%s'", path_of("linked"), path_of(reports[i])), 2);
        assert_true(output_contains("stderr.txt", "would overwrite a file of the checkpoint being scanned"));
    }
    size_t len = 0;
    char *now = tu_slurp(shard, &len);
    assert_true(len == shard_len && !memcmp(now, shard_before, len));
    free(now);
    now = tu_slurp(config, &len);
    assert_true(len == config_len && !memcmp(now, config_before, len));
    free(now);
    free(shard_before);
    free(config_before);
    /* a report elsewhere still works; /dev/stdout is stdout, the report alone on it */
    assert_int_equal(run_cli("scan '%s' --json '%s'", path_of("linked"), path_of("fresh.json")), 0);
    assert_int_equal(run_cli("scan '%s' --json /dev/stdout", path_of("linked")), 0);
    json_error_t err;
    json_t *j = json_load_file(path_of("stdout.txt"), 0, &err);
    if (!j) fail_msg("scan --json /dev/stdout: stdout is not the JSON report: %s", err.text);
    json_decref(j);
    /* "--" ends the options of scan and replay, as of the other commands */
    assert_int_equal(run_cli("scan --json '%s' -- '%s'", path_of("fresh.json"), path_of("linked")), 0);
    assert_int_equal(run_cli("replay --layer " LAYER " --backend cpu -- '%s'", path_of("linked")), 0);
    assert_true(output_contains("stdout.txt", "PASS"));
    assert_int_equal(run_cli("scan -- '%s' '%s'", path_of("linked"), path_of("mo")), 2);
    assert_int_equal(run_cli("scan '%s' --json ''", path_of("linked")), 2);
    assert_int_equal(output_size("stdout.txt"), 0);
}

/* A plugin that cannot be loaded (FP4DOCTOR_PLUGINS) is an unreadable input, 3, as in backends
 * and check; replay said 4, fp4doctor's own failure. */
static void test_replay_plugin_unloadable(void **state)
{
    (void)state;
    assert_int_equal(tu_run_cli(bin, dir, "FP4DOCTOR_PLUGINS=/nonexistent/fp4d-plugin.so",
                                "replay '%s' --layer " LAYER " --backend ref", path_of("mo")),
                     3);
    assert_true(output_contains("stderr.txt", "/nonexistent/fp4d-plugin.so"));
}

/* The limit on a backend's two calls grows with the layer: a fixed 120 s called the exact
 * reference a hang (TIMEOUT, exit 1) on a 2048 x 8192 layer at --rows 2048, which needs about
 * four minutes. */
static void test_replay_timeout_grows_with_work(void **state)
{
    (void)state;
    unsetenv("FP4DOCTOR_TIMEOUT_SCALE");
    const double small = fp4d_replay_call_timeout(true, 16, 64, 128);
    assert_true(small >= 120 && small < 125);
    assert_true(fp4d_replay_call_timeout(false, 16, 64, 128) >= 120);
    assert_true(fp4d_replay_call_timeout(true, 2048, 2048, 8192) > 3600);
    /* the reference gets the slow rate, a cpu backend the fast one, as in check */
    assert_true(fp4d_replay_call_timeout(true, 4096, 4096, 4096) > fp4d_replay_call_timeout(false, 4096, 4096, 4096));
    setenv("FP4DOCTOR_TIMEOUT_SCALE", "2", 1);
    assert_true(fp4d_replay_call_timeout(true, 16, 64, 128) > 1.99 * small);
    unsetenv("FP4DOCTOR_TIMEOUT_SCALE");
}

/* ---- bench --------------------------------------------------------------------------------- */

/* A shape under the host-timing work limit but far past memory is skipped with its size said;
 * it was allocated (8 GB of activations and 16 GB inside the cpu kernel) until the machine ran
 * out. Run with a 2 GiB address-space cap so that the old behaviour fails here (ERROR: NOMEM)
 * instead of taking the machine's memory. */
static void test_bench_huge_shape_skipped(void **state)
{
    (void)state;
    if (TU_SANITIZED) skip(); /* the sanitizer's shadow memory does not fit the 2 GiB cap */
    assert_int_equal(run_cli_capped("bench --backend cpu --shapes 1x131072 --m 30000 --no-moe --repeats 1 --rounds 1 "
                                    "--json '%s'",
                                    path_of("huge.json")),
                     0);
    json_error_t err;
    json_t *root = json_load_file(path_of("huge.json"), 0, &err);
    assert_non_null(root);
    json_t *rows = json_object_get(root, "results");
    assert_int_equal(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        const char *st = json_string_value(json_object_get(json_array_get(rows, i), "status"));
        assert_non_null(st);
        assert_non_null(strstr(st, "SKIPPED: host timing would take"));
    }
    json_decref(root);
    assert_true(output_contains("stdout.txt", "GiB of memory"));
    /* a shape that fits is still timed */
    assert_int_equal(run_cli_capped("bench --backend cpu --shapes 64x64 --m 1 --no-moe --repeats 1 --rounds 1"), 0);
    assert_false(output_contains("stdout.txt", "SKIPPED"));
}

/* The table's figures for host-timed rows are readable (0.00203 TFLOP/s printed as 0.0) and it
 * says what the ratios are against, or that there are none. */
static void test_bench_text_figures_and_anchor(void **state)
{
    (void)state;
    assert_int_equal(run_cli("bench --backend cpu,ref --shapes 64x64 --m 1 --no-moe --repeats 1 --rounds 1"), 0);
    char *s = tu_slurp(path_of("stdout.txt"), NULL);
    assert_non_null(s);
    char *line = strstr(s, "\ncpu ");
    assert_non_null(line);
    char backend[16], mode[16];
    int dev;
    long long m, n, k, e;
    double us, tflops, gbps;
    assert_int_equal(sscanf(line + 1, "%15s %15s %d %lld %lld %lld %lld %lf %lf %lf", backend, mode, &dev, &m, &n, &k, &e,
                            &us, &tflops, &gbps),
                     10);
    /* 2*64*64 flops over the median: the printed figure within its three digits */
    const double expect = 2.0 * 64 * 64 / (us * 1e-6) / 1e12;
    assert_true(tflops > 0 && gbps > 0);
    assert_true(tflops > expect * 0.99 && tflops < expect * 1.01);
    free(s);
    assert_true(output_contains("stdout.txt", "# vs_bf16: none, cublas-bf16 was not timed in this run"));
}

/* Ctrl-C: the rows measured so far are reported, the JSON written, nothing left beside it,
 * exit 1. It killed the run with nothing printed and a FILE.tmp-XXXXXX left behind. */
static void test_bench_sigint_reports_partial(void **state)
{
    (void)state;
    const char *json = path_of("int.json");
    FILE *f = fopen(json, "w");
    assert_non_null(f);
    fputs("{\"old\": 1}\n", f);
    fclose(f);
    /* long enough to be running when the signal comes: many host-timed 4096x4096 configurations */
    char shapes[1024] = "64x64";
    for (int i = 0; i < 31; i++) strcat(shapes, ",4096x4096");
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGINT, SIG_DFL); /* ctest or a shell may have started us with it ignored */
        if (!freopen(path_of("stdout.txt"), "w", stdout) || !freopen(path_of("stderr.txt"), "w", stderr)) _exit(99);
        execl(bin, bin, "bench", "--backend", "cpu", "--shapes", shapes, "--m", "1,200", "--no-moe", "--repeats", "5",
              "--rounds", "1", "--json", json, (char *)NULL);
        _exit(98);
    }
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    kill(pid, SIGINT);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        fprintf(stderr, "bench finished before the signal: nothing to check on this machine\n");
        return;
    }
    assert_true(WIFEXITED(st)); /* not killed by the signal */
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_true(output_contains("stderr.txt", "interrupted"));
    assert_true(output_contains("stdout.txt", "backend"));
    json_error_t err;
    json_t *root = json_load_file(json, 0, &err);
    assert_non_null(root);
    json_t *rows = json_object_get(root, "results");
    assert_non_null(rows);
    assert_true(json_array_size(rows) >= 1);
    assert_true(json_array_size(rows) < 2 * 32 * 2); /* not every configuration */
    json_decref(root);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) assert_null(strstr(de->d_name, ".tmp-"));
    closedir(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_backend_list_checked),
        cmocka_unit_test(test_replay_nan_block_scales_fail),
        cmocka_unit_test(test_replay_layer_names),
        cmocka_unit_test(test_replay_follows_the_index),
        cmocka_unit_test(test_replay_unreadable_indexed_shard),
        cmocka_unit_test(test_replay_unindexed_files),
        cmocka_unit_test(test_replay_unusable_index),
        cmocka_unit_test(test_replay_tensor_parallel_shard),
        cmocka_unit_test(test_tensor_parallel_cuts_attention_by_head),
        cmocka_unit_test(test_tensor_parallel_fused_qkv),
        cmocka_unit_test(test_tensor_parallel_fused_gate_up),
        cmocka_unit_test(test_scan_report_never_overwrites_the_checkpoint),
        cmocka_unit_test(test_replay_plugin_unloadable),
        cmocka_unit_test(test_replay_timeout_grows_with_work),
        cmocka_unit_test(test_bench_huge_shape_skipped),
        cmocka_unit_test(test_bench_text_figures_and_anchor),
        cmocka_unit_test(test_bench_sigint_reports_partial),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
