/*
 * Fuzz target: a checkpoint folder's model.safetensors.index.json and config.json (or
 * hf_quant_config.json) through the scanner's loading (src/scan/scan.c load_index/load_configs),
 * which read them only from files: each input is written into a temporary checkpoint folder
 * next to one small valid shard, then scanned and the report written as JSON.
 *
 * Input: one flag byte, then the index text, a NUL, the config text.
 *   bit 0: write the index (else the folder's .safetensors files are scanned)
 *   bit 1: the config is hf_quant_config.json (else config.json)
 *   bit 2: leave the config out
 *   bit 3: a second shard, a copy of the first (every tensor duplicated)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fp4doctor/scan.h"
#include "fuzz.h"

static char ck_dir[64];

static const char *const ck_files[] = {"model.safetensors.index.json", "config.json", "hf_quant_config.json",
                                       "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

static void ck_path(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", ck_dir, name); }

static void ck_remove(void)
{
    char p[128];
    for (size_t i = 0; i < sizeof ck_files / sizeof ck_files[0]; i++) {
        ck_path(p, sizeof p, ck_files[i]);
        unlink(p);
    }
    rmdir(ck_dir);
}

static int ck_write(const char *name, const void *data, size_t n)
{
    char p[128];
    ck_path(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* One NVFP4 linear: packed weight, block scales, global scale; header padded to 8 bytes. */
static size_t ck_shard(uint8_t *buf, size_t cap)
{
    static const char hdr[] =
        "{\"model.layers.0.mlp.down_proj.weight\":{\"dtype\":\"U8\",\"shape\":[2,8],\"data_offsets\":[0,16]},"
        "\"model.layers.0.mlp.down_proj.weight_scale\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,1],\"data_offsets\":[16,18]},"
        "\"model.layers.0.mlp.down_proj.weight_scale_2\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[18,22]}}";
    size_t h = sizeof hdr - 1, padded = (h + 7) & ~(size_t)7;
    if (8 + padded + 22 > cap) return 0;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, hdr, h);
    memset(buf + 8 + h, ' ', padded - h);
    uint8_t *d = buf + 8 + padded;
    for (int i = 0; i < 16; i++) d[i] = (uint8_t)(0x21 * (i + 1));
    d[16] = d[17] = 0x38;                          /* E4M3 1.0 */
    static const uint8_t one_f32[4] = {0, 0, 0x80, 0x3F}; /* 1.0f, little-endian */
    memcpy(d + 18, one_f32, 4);
    return 8 + padded + 22;
}

int fp4d_fuzz_ckpt_index(const uint8_t *data, size_t size)
{
    static uint8_t shard[512];
    static size_t shard_len;
    if (!ck_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(ck_dir, sizeof ck_dir, "%s/fp4d-fuzz-XXXXXX", tmp && strlen(tmp) < 32 ? tmp : "/tmp");
        if (!mkdtemp(ck_dir)) abort();
        atexit(ck_remove);
        shard_len = ck_shard(shard, sizeof shard);
        if (!shard_len || ck_write(ck_files[3], shard, shard_len)) abort();
    }
    unsigned flags = size ? data[0] : 0;
    const char *text = size ? (const char *)data + 1 : "";
    size_t len = size ? size - 1 : 0;
    const char *nul = memchr(text, '\0', len);
    size_t ilen = nul ? (size_t)(nul - text) : len;
    const char *cfg = nul ? nul + 1 : "";
    size_t clen = nul ? len - ilen - 1 : 0;

    char p[128];
    for (size_t i = 0; i < 3; i++) {
        ck_path(p, sizeof p, ck_files[i]);
        unlink(p);
    }
    ck_path(p, sizeof p, ck_files[4]);
    unlink(p);
    if ((flags & 1) && ck_write(ck_files[0], text, ilen)) abort();
    if (!(flags & 4) && ck_write((flags & 2) ? ck_files[2] : ck_files[1], cfg, clen)) abort();
    if ((flags & 8) && ck_write(ck_files[4], shard, shard_len)) abort();

    fp4d_scan_options opt = {0};
    opt.threads = 1;
    fp4d_scan_report *r = NULL;
    if (fp4d_scan_path(ck_dir, &opt, &r) == FP4D_STATUS_OK && r) {
        for (size_t i = 0; i < fp4d_scan_report_count(r); i++) {
            const fp4d_scan_finding *f = fp4d_scan_report_get(r, i);
            if (!f || !f->message) abort();
        }
        char *json = NULL;
        if (fp4d_scan_report_json(r, &json) == FP4D_STATUS_OK) free(json);
    }
    fp4d_scan_report_free(r);
    return 0;
}

#ifdef FP4D_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fp4d_fuzz_ckpt_index(data, size); }
#endif
