/*
 * `fp4doctor probe` as a user runs it: exit codes, --json, the API key never shown, Ctrl-C,
 * and the stop time on a hung server. The binary comes from $FP4DOCTOR_BIN (set by ctest);
 * the servers are fake_server.c instances on loopback.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "fake_server.h"
#include "fp4doctor/probe.h"
#include "test_util.h"

static const char *bin;
/* When set, the next run_probe's child gets this RLIMIT_NOFILE (then it is cleared). */
static struct rlimit next_files;
static bool next_files_set;

typedef struct cli_result {
    int    code;    /* exit code, or 128 + signal */
    char  *out, *err;
    double seconds;
} cli_result;

/* Runs `fp4doctor probe ARGS...` (NULL-terminated). When sigint_after > 0, sends SIGINT
 * that many seconds after the start. */
static cli_result run_probe(double sigint_after, const char *first, ...)
{
    const char *argv[32] = {bin, "probe"};
    int argc = 2;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a && argc < 31; a = va_arg(ap, const char *)) argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;

    char out_path[] = "/tmp/fp4d_probe_out_XXXXXX", err_path[] = "/tmp/fp4d_probe_err_XXXXXX";
    int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
    assert_true(out_fd >= 0 && err_fd >= 0);
    double t0 = tu_now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    bool files = next_files_set;
    next_files_set = false;
    if (pid == 0) {
        if (files && setrlimit(RLIMIT_NOFILE, &next_files) != 0) _exit(126);
        dup2(out_fd, 1);
        dup2(err_fd, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (sigint_after > 0) {
        struct timespec ts = {(time_t)sigint_after, (long)((sigint_after - (time_t)sigint_after) * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGINT);
    }
    waitpid(pid, &status, 0);
    cli_result r = {0};
    r.seconds = tu_now_s() - t0;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    close(out_fd);
    close(err_fd);
    r.out = tu_slurp_or_empty(out_path);
    r.err = tu_slurp_or_empty(err_path);
    unlink(out_path);
    unlink(err_path);
    return r;
}

static void cli_free(cli_result *r)
{
    free(r->out);
    free(r->err);
}

static void expect_code(cli_result r, int code)
{
    if (r.code != code) fail_msg("exit %d, expected %d\nstdout: %s\nstderr: %s", r.code, code, r.out, r.err);
}

static void test_usage_errors(void **state)
{
    (void)state;
    cli_result r = run_probe(0, "--help", NULL);
    expect_code(r, 0);
    assert_non_null(strstr(r.out, "--concurrency"));
    assert_non_null(strstr(r.out, "--api-key-env"));
    cli_free(&r);

    const char *bad[][4] = {
        {NULL},                                                  /* no URL */
        {"http://127.0.0.1:1", "--bogus", NULL},
        {"http://127.0.0.1:1", "--concurrency", "0", NULL},
        {"http://127.0.0.1:1", "--concurrency", " 2", NULL}, /* strtoul skipped the space */
        {"http://127.0.0.1:1", "--rounds", "+1", NULL},
        {"http://127.0.0.1:1", "--rounds", "x", NULL},
        {"http://127.0.0.1:1", "--timeout", "-1", NULL},
        {"http://127.0.0.1:1", "--api", "responses", NULL},
        {"http://127.0.0.1:1", "--api-key-env", "FP4D_TEST_SURELY_UNSET_VAR", NULL},
        {"ftp://127.0.0.1:1/", NULL},
        {"http://127.0.0.1:1", "http://127.0.0.1:2", NULL},
        {"http://127.0.0.1:1", "--model", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = run_probe(0, bad[i][0], bad[i][0] ? bad[i][1] : NULL, bad[i][0] && bad[i][1] ? bad[i][2] : NULL,
                      NULL);
        if (r.code != 2) fail_msg("case %zu: exit %d, expected 2 (stderr: %s)", i, r.code, r.err);
        /* One clear line on stderr, nothing else. */
        assert_non_null(strstr(r.err, "fp4doctor probe: "));
        assert_int_equal(strchr(r.err, '\n') - r.err + 1, (long)strlen(r.err));
        cli_free(&r);
    }
}

/* Bad URLs: exit 2 with one line that says what is wrong, and never the URL's password
 * (port 0 used to be probed, exit 3; the messages quoted user:password@ as given). */
static void test_bad_urls(void **state)
{
    (void)state;
    static const struct {
        const char *url, *says;
    } bad[] = {
        {"http://127.0.0.1:0", "1..65535"},
        {"http://[::1]:0/v1", "1..65535"},
        {"http://127.0.0.1:99999", "1..65535"},
        {"http://admin:topsecret@127.0.0.1:-5/", "1..65535"},
        {"http://admin:topsecret@[::1", "IPv6"},
        {"ftp://admin:topsecret@127.0.0.1/", "only http:// and https://"},
        {"admin:topsecret@localhost:30000", "put http:// or https:// in front"},
        {"localhost:30000", "put http:// or https:// in front"},
        {"http://", "not a URL"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cli_result r = run_probe(0, bad[i].url, "--timeout", "2", NULL);
        if (r.code != 2) fail_msg("%s: exit %d, expected 2 (stderr: %s)", bad[i].url, r.code, r.err);
        if (!strstr(r.err, bad[i].says)) fail_msg("%s: stderr lacks \"%s\": %s", bad[i].url, bad[i].says, r.err);
        if (strstr(r.err, "topsecret") || strstr(r.out, "topsecret"))
            fail_msg("%s: the password was printed: %s", bad[i].url, r.err);
        assert_int_equal(strchr(r.err, '\n') - r.err + 1, (long)strlen(r.err));
        cli_free(&r);
    }
}

/* More requests in flight than the open-file limit allows: with a soft limit below the window
 * the probe raises it (up to the hard limit) and is healthy; with a hard limit below it, it
 * refuses before sending anything (exit 2). It used to send anyway, fail the connects in the
 * client and blame the server: "broken_under_concurrency", exit 1. */
static void test_open_file_limit(void **state)
{
    (void)state;
    struct rlimit now;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &now), 0);
    if (now.rlim_max != RLIM_INFINITY && now.rlim_max < 1024) skip(); /* cannot set up case 1 */
    fake_config cfg = {.behavior = FAKE_HEALTHY, .delay_ms = 400};
    fake_server *s = fake_server_start(&cfg);
    assert_non_null(s);

    next_files = (struct rlimit){96, 1024};
    next_files_set = true;
    cli_result r = run_probe(0, fake_server_url(s), "--concurrency", "160", "--rounds", "1", "--timeout", "30", NULL);
    fake_stats st = fake_server_stats(s);
    expect_code(r, 0);
    assert_non_null(strstr(r.out, "verdict   healthy"));
    assert_int_equal(st.posts, 160);
    assert_true(st.max_in_flight > 96); /* the window really went past the old soft limit */
    cli_free(&r);

    next_files = (struct rlimit){96, 96};
    next_files_set = true;
    r = run_probe(0, fake_server_url(s), "--concurrency", "160", "--rounds", "1", "--timeout", "30", NULL);
    fake_stats st2 = fake_server_stats(s);
    fake_server_stop(s);
    expect_code(r, 2);
    assert_non_null(strstr(r.err, "open files"));
    assert_non_null(strstr(r.err, "--concurrency 160"));
    assert_int_equal(st2.posts, st.posts); /* nothing sent */
    assert_int_equal(st2.health_gets, st.health_gets);
    cli_free(&r);
}

static void test_unreachable_exit_3(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    fake_server *s = fake_server_start(&cfg);
    char url[64];
    snprintf(url, sizeof url, "%s", fake_server_url(s));
    fake_server_stop(s);
    cli_result r = run_probe(0, url, "--timeout", "5", NULL);
    expect_code(r, 3);
    assert_non_null(strstr(r.out, "unreachable"));
    cli_free(&r);
}

static void test_healthy_json_file(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HEALTHY};
    fake_server *s = fake_server_start(&cfg);
    char json_path[] = "/tmp/fp4d_probe_json_XXXXXX";
    int fd = mkstemp(json_path);
    close(fd);
    cli_result r = run_probe(0, fake_server_url(s), "--concurrency", "3", "--rounds", "2", "--json", json_path, NULL);
    fake_stats st = fake_server_stats(s);
    fake_server_stop(s);
    expect_code(r, 0);
    assert_non_null(strstr(r.out, "verdict   healthy"));

    json_error_t e;
    json_t *doc = json_load_file(json_path, 0, &e);
    unlink(json_path);
    if (!doc) fail_msg("--json output is not JSON: %s", e.text);
    assert_int_equal(json_integer_value(json_object_get(doc, "schema_version")), FP4D_PROBE_SCHEMA_VERSION);
    assert_string_equal(json_string_value(json_object_get(doc, "verdict")), "healthy");
    assert_string_equal(json_string_value(json_object_get(doc, "model")), "fake-model");
    json_t *req = json_object_get(doc, "requests");
    assert_int_equal(json_integer_value(json_object_get(req, "generation")), st.posts);
    assert_true(json_integer_value(json_object_get(req, "generation")) <= 6);
    json_t *phases = json_object_get(doc, "phases");
    assert_int_equal(json_array_size(phases), 2);
    long long ok = 0;
    for (size_t i = 0; i < 2; i++) {
        json_t *ph = json_array_get(phases, i);
        assert_true(json_is_true(json_object_get(ph, "healthy")));
        ok += json_integer_value(json_object_get(json_object_get(ph, "counts"), "OK"));
        assert_true(json_is_null(json_object_get(ph, "first_offending")));
        assert_true(json_is_number(json_object_get(json_object_get(ph, "latency_ms"), "p99")));
    }
    assert_int_equal(ok, 6);
    assert_int_equal(json_array_size(json_object_get(doc, "responses")), 6);
    assert_int_equal(json_integer_value(json_object_get(doc, "exit_code")), 0);
    json_decref(doc);
    cli_free(&r);
}

/* `probe URL --concurrency C --rounds R --json -` against a fake server of behaviour b. */
static cli_result probe_json_against(fake_behavior b, const char *concurrency, const char *rounds)
{
    fake_config cfg = {.behavior = b};
    fake_server *s = fake_server_start(&cfg);
    assert_non_null(s);
    cli_result r = run_probe(0, fake_server_url(s), "--concurrency", concurrency, "--rounds", rounds, "--json", "-", NULL);
    fake_server_stop(s);
    return r;
}

static void test_nan_json_stdout(void **state)
{
    (void)state;
    cli_result r = probe_json_against(FAKE_NAN_STOP, "2", "2");
    expect_code(r, 1);
    /* JSON alone on stdout; the text report went to stderr. */
    json_error_t e;
    json_t *doc = json_loads(r.out, 0, &e);
    if (!doc) fail_msg("stdout is not JSON: %s\n%s", e.text, r.out);
    assert_string_equal(json_string_value(json_object_get(doc, "verdict")), "broken_at_concurrency_1");
    json_t *ph1 = json_array_get(json_object_get(doc, "phases"), 0);
    json_t *q = json_object_get(ph1, "first_offending");
    assert_string_equal(json_string_value(json_object_get(q, "class")), "NAN_STOP");
    assert_string_equal(json_string_value(json_object_get(q, "matched_stop")), "NaN happened");
    assert_true(json_is_false(json_object_get(ph1, "healthy")));
    json_decref(doc);
    assert_non_null(strstr(r.err, "NAN_STOP"));
    assert_non_null(strstr(r.err, "broken_at_concurrency_1"));
    cli_free(&r);
}

/* True when the text holds no ESC, no C1 CSI (raw 0x9B, or U+009B) and no invalid byte 0xFF. */
static bool terminal_safe(const char *t)
{
    return !strchr(t, '\x1b') && !strchr(t, '\x9b') && !strchr(t, '\xff') && !strstr(t, "\xc2\x9b");
}

/* A server's words reach the terminal without its escape sequences; the JSON keeps the body
 * whole past a NUL byte; a model id longer than the report holds is not sent cut. */
static void test_hostile_server_text(void **state)
{
    (void)state;
    cli_result r = probe_json_against(FAKE_HOSTILE_TEXT, "1", "1");
    expect_code(r, 1);
    assert_non_null(strstr(r.err, "NAN_STOP"));
    if (!terminal_safe(r.err)) fail_msg("escape sequences reached the text report:\n%s", r.err);
    cli_free(&r);

    r = probe_json_against(FAKE_HOSTILE_RAW, "1", "1");
    expect_code(r, 1);
    if (!terminal_safe(r.err)) fail_msg("raw bytes reached the text report:\n%s", r.err);
    json_t *doc = json_loads(r.out, 0, NULL);
    assert_non_null(doc);
    json_t *q = json_object_get(json_array_get(json_object_get(doc, "phases"), 0), "first_offending");
    assert_non_null(strstr(json_string_value(json_object_get(q, "body")), "after the NUL"));
    json_decref(doc);
    cli_free(&r);

    static char long_id[301];
    memset(long_id, 'm', 300);
    fake_config cfg = {.behavior = FAKE_HEALTHY, .model_id = long_id};
    fake_server *s = fake_server_start(&cfg);
    r = run_probe(0, fake_server_url(s), "--concurrency", "1", "--rounds", "1", NULL);
    fake_stats st = fake_server_stats(s);
    fake_server_stop(s);
    assert_string_equal(st.last_model, "default");
    assert_non_null(strstr(r.out, "300 bytes"));
    cli_free(&r);
    r = run_probe(0, "http://127.0.0.1:1", "--model", long_id, NULL);
    expect_code(r, 2);
    cli_free(&r);
}

static void test_api_key_never_shown(void **state)
{
    (void)state;
    const char *key = "sk-cli-secret-8128";
    fake_config cfg = {.behavior = FAKE_HEALTHY, .required_key = key};
    fake_server *s = fake_server_start(&cfg);
    setenv("FP4D_TEST_PROBE_KEY", key, 1);
    cli_result r = run_probe(0, fake_server_url(s), "--concurrency", "2", "--rounds", "2", "--api-key-env",
                             "FP4D_TEST_PROBE_KEY", "--json", "-", NULL);
    unsetenv("FP4D_TEST_PROBE_KEY");
    fake_stats st = fake_server_stats(s);
    fake_server_stop(s);
    expect_code(r, 0);
    assert_int_equal(st.auth_ok, 4);
    assert_int_equal(st.auth_bad, 0);
    assert_null(strstr(r.out, key));
    assert_null(strstr(r.err, key));
    cli_free(&r);
}

static void test_hung_server_timeout(void **state)
{
    (void)state;
    fake_config cfg = {.behavior = FAKE_HANG};
    fake_server *s = fake_server_start(&cfg);
    cli_result r = run_probe(0, fake_server_url(s), "--timeout", "2", NULL);
    fake_stats st = fake_server_stats(s);
    fake_server_stop(s);
    expect_code(r, 1);
    /* --timeout 2 must end the probe within about 2 s; allow for a loaded machine. */
    assert_true(r.seconds < 4.5);
    assert_int_equal(st.posts, 1);
    assert_non_null(strstr(r.out, "TIMEOUT"));
    assert_non_null(strstr(r.out, "stopped early: timeout"));
    cli_free(&r);
}

static void test_ctrl_c_partial_report(void **state)
{
    (void)state;
    /* 300 ms per answer, a budget of 100 requests: Ctrl-C after 1 s. */
    fake_config cfg = {.behavior = FAKE_HEALTHY, .delay_ms = 300};
    fake_server *s = fake_server_start(&cfg);
    cli_result r = run_probe(1.0, fake_server_url(s), "--concurrency", "2", "--rounds", "50", NULL);
    fake_stats st = fake_server_stats(s);
    fake_server_stop(s);
    expect_code(r, 1);
    assert_true(r.seconds < 3.5);
    assert_true(st.posts < 100);
    assert_non_null(strstr(r.out, "stopped early: interrupted"));
    assert_non_null(strstr(r.out, "verdict"));
    cli_free(&r);
}

int main(void)
{
    bin = getenv("FP4DOCTOR_BIN");
    if (!bin || access(bin, X_OK) != 0) {
        fprintf(stderr, "FP4DOCTOR_BIN is not set to the fp4doctor binary (run through ctest)\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_bad_urls),
        cmocka_unit_test(test_open_file_limit),
        cmocka_unit_test(test_unreachable_exit_3),
        cmocka_unit_test(test_healthy_json_file),
        cmocka_unit_test(test_nan_json_stdout),
        cmocka_unit_test(test_api_key_never_shown),
        cmocka_unit_test(test_hostile_server_text),
        cmocka_unit_test(test_hung_server_timeout),
        cmocka_unit_test(test_ctrl_c_partial_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
