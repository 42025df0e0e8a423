/* arch_list.c - the rules of CUDA binary and PTX compatibility over a build's list of
 * architectures (arch_list.h). Entries are walked in place: a list of any length is read
 * whole, never cut inside a name (a "compute_100a" cut to "compute_10" would claim every GPU). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/arch_list.h"

static const char SEPARATORS[] = ",;";

/* One entry, as `len` bytes at `s`: a version (e.g. 90, 100), its suffix ('a', 'f' or 0), and
 * whether it stands for SASS, PTX or both. False for anything else. */
typedef struct arch_entry {
    int  version;
    char suffix;
    bool sass, ptx;
} arch_entry;

static bool parse_version(const char *s, size_t len, int *version, char *suffix)
{
    size_t i = 0;
    int v = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9' && v < 10000) v = v * 10 + (s[i++] - '0');
    if (i == 0 || v < 10) return false;
    *suffix = '\0';
    if (i < len && (s[i] == 'a' || s[i] == 'f')) *suffix = s[i++];
    *version = v;
    return i == len;
}

static bool parse_entry(const char *s, size_t len, arch_entry *e)
{
    static const char SM[] = "sm_", COMPUTE[] = "compute_";
    if (len > sizeof SM - 1 && !strncmp(s, SM, sizeof SM - 1)) {
        e->sass = true, e->ptx = false;
        return parse_version(s + sizeof SM - 1, len - (sizeof SM - 1), &e->version, &e->suffix);
    }
    if (len > sizeof COMPUTE - 1 && !strncmp(s, COMPUTE, sizeof COMPUTE - 1)) {
        e->sass = false, e->ptx = true;
        return parse_version(s + sizeof COMPUTE - 1, len - (sizeof COMPUTE - 1), &e->version, &e->suffix);
    }
    const char *dash = memchr(s, '-', len);
    const size_t vlen = dash ? (size_t)(dash - s) : len;
    if (dash) {
        const size_t rest = len - vlen - 1;
        e->sass = rest == 4 && !strncmp(dash + 1, "real", 4);
        e->ptx = rest == 7 && !strncmp(dash + 1, "virtual", 7);
        if (!e->sass && !e->ptx) return false;
    } else {
        e->sass = e->ptx = true; /* a bare "90a" is CMake's "90a-real;90a-virtual" */
    }
    return parse_version(s, vlen, &e->version, &e->suffix);
}

/* Appends ",text" (or "text" first); false, with "..." in its place where it fits, when the
 * entry does not fit whole. */
static bool append(char *out, size_t cap, size_t *used, const char *prefix, const char *text, size_t len)
{
    const size_t need = (*used ? 1 : 0) + strlen(prefix) + len;
    if (need >= cap - *used) {
        const char *more = *used ? ",..." : "...";
        if (strlen(more) < cap - *used) memcpy(out + *used, more, strlen(more) + 1);
        return false;
    }
    snprintf(out + *used, cap - *used, "%s%s%.*s", *used ? "," : "", prefix, (int)len, text);
    *used += need;
    return true;
}

void fp4d_arch_list_describe(const char *cmake_list, char *out, size_t cap)
{
    if (cap == 0) return;
    out[0] = '\0';
    size_t used = 0;
    for (const char *s = cmake_list ? cmake_list : ""; *s;) {
        const size_t len = strcspn(s, SEPARATORS);
        arch_entry e;
        char name[16];
        if (len == 0) {
            /* an empty entry */
        } else if (!parse_entry(s, len, &e)) {
            if (!append(out, cap, &used, "", s, len)) return;
        } else {
            const int n = e.suffix ? snprintf(name, sizeof name, "%d%c", e.version, e.suffix)
                                   : snprintf(name, sizeof name, "%d", e.version);
            if (e.sass && !append(out, cap, &used, "sm_", name, (size_t)n)) return;
            if (e.ptx && !append(out, cap, &used, "compute_", name, (size_t)n)) return;
        }
        s += len;
        if (*s) s++;
    }
}

/* Whether code for `version` with `suffix` may run on a GPU of version `cc` (both as major * 10
 * + minor). Plain SASS reaches later minors of its major; plain PTX every later version. */
static bool compatible(int version, char suffix, int cc, bool is_ptx, bool integrated)
{
    if (suffix == 'a') return version == cc;
    if (!is_ptx && integrated) return version == cc;
    const bool same_family = version / 10 == cc / 10 && version <= cc;
    if (suffix == 'f') return same_family;
    return is_ptx ? version <= cc : same_family;
}

fp4d_arch_code fp4d_arch_list_code_for(const char *archs, int major, int minor, bool integrated)
{
    const int cc = major * 10 + minor;
    bool ptx = false, unknown = false;
    for (const char *s = archs ? archs : ""; *s;) {
        const size_t len = strcspn(s, SEPARATORS);
        arch_entry e;
        if (len > 0 && !parse_entry(s, len, &e)) {
            unknown = true;
        } else if (len > 0) {
            if (e.sass && compatible(e.version, e.suffix, cc, false, integrated)) return FP4D_ARCH_CODE_NATIVE;
            if (e.ptx && compatible(e.version, e.suffix, cc, true, integrated)) ptx = true;
        }
        s += len;
        if (*s) s++;
    }
    return ptx ? FP4D_ARCH_CODE_PTX : unknown ? FP4D_ARCH_CODE_UNKNOWN : FP4D_ARCH_CODE_NONE;
}
