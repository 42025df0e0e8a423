/*
 * Replays the committed seed corpus (fuzz/corpus/<target>/) through the fuzz entry points,
 * without libFuzzer, so CI runs every past crash and every seed as an ordinary test (the
 * zstd tests/fuzz/regression_driver.c idea). Under `make asan` this is a sanitizer run.
 * Extra arguments: files or directories to replay through the st_header target.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

typedef int (*fuzz_fn)(const uint8_t *, size_t);

static int run_file(fuzz_fn fn, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            uint8_t *g = realloc(buf, cap *= 2);
            if (!g) break;
            buf = g;
        }
    }
    fclose(f);
    if (!buf) return 1;
    /* An exact-size copy, so ASan sees any read past the end. */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    fn(exact, n);
    free(exact);
    return 0;
}

static int run_dir(fuzz_fn fn, const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "cannot open corpus %s\n", dir);
        return 1;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc |= run_file(fn, path);
        (*count)++;
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    size_t count = 0;
    int rc = 0;
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            struct stat st;
            if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) rc |= run_dir(fp4d_fuzz_st_header, argv[i], &count);
            else rc |= run_file(fp4d_fuzz_st_header, argv[i]), count++;
        }
    } else {
        rc |= run_dir(fp4d_fuzz_st_header, FP4D_FUZZ_CORPUS_DIR "/st_header", &count);
        rc |= run_dir(fp4d_fuzz_quant_config, FP4D_FUZZ_CORPUS_DIR "/quant_config", &count);
        rc |= run_dir(fp4d_fuzz_names, FP4D_FUZZ_CORPUS_DIR "/names", &count);
        rc |= run_dir(fp4d_fuzz_probe_classify, FP4D_FUZZ_CORPUS_DIR "/probe_classify", &count);
        rc |= run_dir(fp4d_fuzz_ckpt_index, FP4D_FUZZ_CORPUS_DIR "/ckpt_index", &count);
        /* The empty input and a lone length field, always. */
        static const uint8_t eight[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        fp4d_fuzz_st_header(eight, 0);
        fp4d_fuzz_st_header(eight, 8);
        fp4d_fuzz_quant_config(eight, 0);
        fp4d_fuzz_names(eight, 0);
        fp4d_fuzz_probe_classify(eight, 0);
        fp4d_fuzz_probe_classify(eight, 1);
        fp4d_fuzz_ckpt_index(eight, 0);
    }
    printf("replayed %zu corpus file(s)\n", count);
    return rc || count == 0;
}
