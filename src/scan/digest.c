/*
 * SHA-256 of a checkpoint file, for `scan --verify-hashes`: a download cut or corrupted after
 * it was named by its digest (a Hugging Face cache blob) reads as a valid safetensors file
 * with wrong numbers, which no structural check can see. OpenSSL's libcrypto does the hashing
 * (a well-kept Debian library; fp4doctor writes no digest of its own); without it the build
 * says so and scan refuses the option.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "scan/scan_internal.h"

#ifdef FP4D_HAVE_LIBCRYPTO
#include <openssl/evp.h>
#endif

/* Read in pieces this large: one pread per piece, the buffer reused. */
#define DIGEST_CHUNK ((size_t)8 << 20)

bool scan_hashes_available(void)
{
#ifdef FP4D_HAVE_LIBCRYPTO
    return true;
#else
    return false;
#endif
}

bool scan_sha256_fd(int fd, uint64_t size, char hex[65], char *why, size_t why_len)
{
    hex[0] = '\0';
#ifndef FP4D_HAVE_LIBCRYPTO
    (void)fd;
    (void)size;
    snprintf(why, why_len, "this fp4doctor was built without OpenSSL's libcrypto");
    return false;
#else
    unsigned char *buf = malloc(DIGEST_CHUNK);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = buf && ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    if (!ok) snprintf(why, why_len, "out of memory");
    for (uint64_t off = 0; ok && off < size;) {
        const size_t want = size - off < DIGEST_CHUNK ? (size_t)(size - off) : DIGEST_CHUNK;
        const ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            snprintf(why, why_len, "%s", got < 0 ? strerror(errno) : "the file ended early (was it cut during the scan?)");
            ok = false;
            break;
        }
        ok = EVP_DigestUpdate(ctx, buf, (size_t)got) == 1;
        if (!ok) snprintf(why, why_len, "the digest failed");
        off += (uint64_t)got;
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (ok && (EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != sizeof md)) {
        snprintf(why, why_len, "the digest failed");
        ok = false;
    }
    for (unsigned i = 0; ok && i < sizeof md; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(ctx);
    free(buf);
    return ok;
#endif
}
