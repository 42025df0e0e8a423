/* arch_list.c - the rules of CUDA binary and PTX compatibility over a build's list of
 * architectures (arch_list.h). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/arch_list.h"

static bool append(char *out, size_t cap, size_t *used, const char *prefix, const char *arch)
{
    int w = snprintf(out + *used, cap - *used, "%s%s%s", *used ? "," : "", prefix, arch);
    if (w < 0 || (size_t)w >= cap - *used) {
        out[*used] = '\0'; /* keep whole entries only */
        return false;
    }
    *used += (size_t)w;
    return true;
}

void fp4d_arch_list_describe(const char *cmake_list, char *out, size_t cap)
{
    if (cap == 0) return;
    out[0] = '\0';
    char buf[256];
    snprintf(buf, sizeof buf, "%s", cmake_list ? cmake_list : "");
    size_t used = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",;", &save); tok; tok = strtok_r(NULL, ",;", &save)) {
        char arch[32];
        snprintf(arch, sizeof arch, "%s", tok);
        char *dash = strchr(arch, '-');
        bool sass = true, ptx = true; /* a bare "90a" is CMake's "90a-real;90a-virtual" */
        if (dash) {
            sass = !strcmp(dash + 1, "real");
            ptx = !strcmp(dash + 1, "virtual");
            *dash = '\0';
        }
        if (sass && !append(out, cap, &used, "sm_", arch)) return;
        if (ptx && !append(out, cap, &used, "compute_", arch)) return;
    }
}

/* "sm_90a" -> 90, 'a'; false when tok is not an architecture with this prefix */
static bool parse_arch(const char *tok, const char *prefix, int *version, char *suffix)
{
    const size_t plen = strlen(prefix);
    if (strncmp(tok, prefix, plen) != 0) return false;
    int v = 0, n = 0;
    if (sscanf(tok + plen, "%d%n", &v, &n) != 1 || v < 10) return false;
    *version = v;
    *suffix = tok[plen + (size_t)n];
    return true;
}

/* Whether code built for `version` with `suffix` may run on a GPU of version `cc` (both as
 * major * 10 + minor). Plain SASS reaches later minors of its major; plain PTX, every later
 * version (plain_reaches_later_majors). */
static bool compatible(int version, char suffix, int cc, bool plain_reaches_later_majors)
{
    if (suffix == 'a') return version == cc;
    const bool same_major = version / 10 == cc / 10 && version <= cc;
    if (suffix == 'f') return same_major;
    return plain_reaches_later_majors ? version <= cc : same_major;
}

fp4d_arch_code fp4d_arch_list_code_for(const char *described, int major, int minor)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", described ? described : "");
    const int cc = major * 10 + minor;
    fp4d_arch_code best = FP4D_ARCH_CODE_NONE;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int v = 0;
        char suffix = '\0';
        if (parse_arch(tok, "sm_", &v, &suffix) && compatible(v, suffix, cc, false)) return FP4D_ARCH_CODE_NATIVE;
        if (parse_arch(tok, "compute_", &v, &suffix) && compatible(v, suffix, cc, true)) best = FP4D_ARCH_CODE_PTX;
    }
    return best;
}
