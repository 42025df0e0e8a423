/*
 * bench_scan.c - `fp4doctor scan` against `cat`: generates a multi-GB ModelOpt NVFP4
 * checkpoint in /tmp (random codes and plausible scales), warms the page cache, then times
 * `cat shards > /dev/null` and the full scan (and --scales-only) on the same files, and
 * reports the speed ratio (goal >= 0.8) and the scan's peak RSS (goal < 256 MiB).
 * The checkpoint is removed afterwards.
 *
 * FP4D_BENCH_SCAN_GB sets the size (default 3); FP4D_BENCH_SCAN_DIR the parent folder.
 */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fp4doctor/scan.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Reads every shard once through a small buffer: the page cache holds them afterwards. */
static unsigned long long warm(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    unsigned long long total = 0;
    static char buf[1 << 20];
    while (d && (e = readdir(d))) {
        if (!strstr(e->d_name, ".safetensors")) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int fd = open(path, O_RDONLY);
        ssize_t n;
        while (fd >= 0 && (n = read(fd, buf, sizeof buf)) > 0) total += (unsigned long long)n;
        if (fd >= 0) close(fd);
    }
    if (d) closedir(d);
    return total;
}

/* Runs the scan in a child so its peak RSS is its own. Returns seconds; *rss_kib out. */
static double timed_scan(const char *dir, bool scales_only, long *rss_kib, size_t *errors)
{
    int pipefd[2];
    if (pipe(pipefd)) return -1;
    double t0 = now_s();
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        fp4d_scan_options opt = {0};
        opt.scales_only = scales_only;
        fp4d_scan_report *r = NULL;
        size_t n = (size_t)-1;
        if (fp4d_scan_path(dir, &opt, &r) == FP4D_STATUS_OK) n = fp4d_scan_report_count_at_least(r, FP4D_SCAN_ERROR);
        else fprintf(stderr, "bench_scan: %s\n", fp4d_last_error());
        fp4d_scan_report_free(r);
        if (write(pipefd[1], &n, sizeof n) != (ssize_t)sizeof n) _exit(1);
        _exit(0);
    }
    close(pipefd[1]);
    if (read(pipefd[0], errors, sizeof *errors) != (ssize_t)sizeof *errors) *errors = (size_t)-1;
    close(pipefd[0]);
    int st;
    struct rusage ru;
    wait4(pid, &st, 0, &ru);
    *rss_kib = ru.ru_maxrss;
    return now_s() - t0;
}

int main(void)
{
    const char *gb_env = getenv("FP4D_BENCH_SCAN_GB"), *parent = getenv("FP4D_BENCH_SCAN_DIR");
    double gb = gb_env ? atof(gb_env) : 3.0;
    if (gb <= 0) gb = 3.0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/fp4d-bench-scan-XXXXXX", parent ? parent : "/tmp");
    if (!mkdtemp(dir)) {
        perror("bench_scan: mkdtemp");
        return 1;
    }
    /* Llama-8B-like layers: hidden 4096, intermediate 12288, ~112 MB of NVFP4 per layer. */
    fp4d_ckpt_gen_params p;
    fp4d_ckpt_gen_defaults(&p, FP4D_CKPT_MODELOPT_NVFP4);
    p.hidden = 4096;
    p.intermediate = 12288;
    p.layers = (int32_t)(gb / 0.112 + 0.5);
    if (p.layers < 1) p.layers = 1;
    p.shards = p.layers < 8 ? p.layers : 8;
    p.random_fill = true;
    double t0 = now_s();
    if (fp4d_ckpt_generate(dir, &p) != FP4D_STATUS_OK) {
        fprintf(stderr, "bench_scan: generate: %s\n", fp4d_last_error());
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        return 1;
    }
    double gen_s = now_s() - t0;
    unsigned long long bytes = warm(dir);
    warm(dir);
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "cat %s/*.safetensors > /dev/null", dir);
    double cat_s = 1e30, scan_s = 1e30, scales_s = 1e30;
    long rss = 0, rss_scales = 0, r;
    size_t errors = 0, e2 = 0;
    for (int rep = 0; rep < 3; rep++) {
        t0 = now_s();
        if (system(cmd) != 0) fprintf(stderr, "bench_scan: cat failed\n");
        double c = now_s() - t0;
        if (c < cat_s) cat_s = c;
        double s = timed_scan(dir, false, &r, &errors);
        if (s < scan_s) scan_s = s;
        if (r > rss) rss = r;
        s = timed_scan(dir, true, &r, &e2);
        if (s < scales_s) scales_s = s;
        if (r > rss_scales) rss_scales = r;
    }
    double g = (double)bytes / 1e9;
    printf("bench_scan: %.2f GB ModelOpt NVFP4 checkpoint (%d layers, %d shards; generated in %.1f s), page cache warm\n",
           g, p.layers, p.shards, gen_s);
    printf("  cat > /dev/null     %6.3f s  %6.2f GB/s\n", cat_s, g / cat_s);
    printf("  scan (full)         %6.3f s  %6.2f GB/s  ratio to cat %.2f (goal >= 0.80)  peak RSS %.1f MiB (goal < 256)\n",
           scan_s, g / scan_s, cat_s / scan_s, (double)rss / 1024.0);
    printf("  scan --scales-only  %6.3f s  %6.2f GB/s of checkpoint  peak RSS %.1f MiB\n", scales_s, g / scales_s,
           (double)rss_scales / 1024.0);
    printf("  error findings on the clean checkpoint: %zu / %zu (expected 0)\n", errors, e2);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return errors == 0 && e2 == 0 ? 0 : 1;
}
