/* replay.h - `fp4doctor replay`: one checkpoint layer's real weights through every backend
 * against the exact reference. Internal to the library and the CLI. */
#ifndef FP4D_SCAN_REPLAY_H
#define FP4D_SCAN_REPLAY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct fp4d_replay_options {
    const char *checkpoint; /* directory or .safetensors file */
    const char *layer;      /* module name, or any of its tensors' names */
    const char *backends;   /* comma-separated names; NULL = every registered backend */
    int64_t     rows;       /* activation rows M */
    uint64_t    seed;
    int         tp;         /* tensor-parallel degree: replay rank's shard of the layer; <= 1: all of it */
    int         rank;       /* 0 .. tp - 1 */
} fp4d_replay_options;

/* Runs the replay and prints the verdicts. Returns a CLI exit code (enum fp4d_exit): 2 for a
 * --backend list with an empty item or a name no backend has, before anything is loaded. */
int fp4d_replay_run(const fp4d_replay_options *opt, FILE *out, bool color);

/* Seconds a backend's child gets for both calls on an m x n x k layer before it is a TIMEOUT;
 * slow: the exact reference or a plugin. FP4DOCTOR_TIMEOUT_SCALE scales it, as in check. */
double fp4d_replay_call_timeout(bool slow, int64_t m, int64_t n, int64_t k);

#endif
