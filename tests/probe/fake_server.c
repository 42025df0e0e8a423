/* The probe tests' OpenAI-compatible server (see fake_server.h). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "fake_server.h"
#include "fp4doctor/probe.h"

struct fake_server {
    struct MHD_Daemon *daemon;
    fake_config        cfg;
    char               key[256];
    char               url[64];
    unsigned short     port;
    atomic_bool        stopping;
    pthread_mutex_t    lock;
    unsigned           in_flight;
    fake_stats         stats;
};

typedef struct request_ctx {
    bool   is_post;
    bool   counted;     /* still counted in in_flight */
    char  *body;
    size_t len;
} request_ctx;

/* A reply before it is written as JSON or SSE. NULL content/reasoning = JSON null. */
typedef struct reply {
    const char *content;
    const char *reasoning;
    const char *finish_reason;
    const char *matched_stop;
} reply;

static void nap(fake_server *s, unsigned ms)
{
    for (unsigned waited = 0; waited < ms && !atomic_load(&s->stopping); waited += 5) {
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                 size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *doc)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (!s) return MHD_NO;
    enum MHD_Result ok = send_text(c, status, "application/json", s, strlen(s));
    free(s);
    return ok;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

static json_t *choice_json(const reply *rp, bool chat, bool stream, bool final, const char *content,
                           const char *reasoning)
{
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(0));
    if (chat) {
        json_t *m = json_object();
        if (!stream) json_object_set_new(m, "role", json_string("assistant"));
        if (!stream || content) json_object_set_new(m, "content", str_or_null(content));
        if (!stream || reasoning) json_object_set_new(m, "reasoning_content", str_or_null(reasoning));
        json_object_set_new(ch, stream ? "delta" : "message", m);
    } else {
        json_object_set_new(ch, "text", json_string(content ? content : ""));
    }
    json_object_set_new(ch, "finish_reason", final ? json_string(rp->finish_reason) : json_null());
    if (final) json_object_set_new(ch, "matched_stop", str_or_null(rp->matched_stop));
    return ch;
}

static json_t *wrap(json_t *choice, bool chat, bool stream)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "id", json_string("cmpl-fake"));
    json_object_set_new(doc, "object", json_string(chat ? (stream ? "chat.completion.chunk" : "chat.completion")
                                                        : "text_completion"));
    json_object_set_new(doc, "model", json_string("fake-model"));
    json_t *choices = json_array();
    json_array_append_new(choices, choice);
    json_object_set_new(doc, "choices", choices);
    return doc;
}

static void append_event(char **buf, size_t *len, json_t *doc)
{
    char *s = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    size_t n = strlen(s);
    *buf = realloc(*buf, *len + n + 9);
    memcpy(*buf + *len, "data: ", 6);
    memcpy(*buf + *len + 6, s, n);
    memcpy(*buf + *len + 6 + n, "\n\n", 3);
    *len += n + 8;
    free(s);
}

/* The SSE body of a reply: the text in pieces of a few bytes, then the finish chunk. */
static char *sse_body(const reply *rp, bool chat, size_t *len)
{
    char *buf = NULL;
    *len = 0;
    if (chat) append_event(&buf, len, wrap(choice_json(rp, chat, true, false, "", NULL), chat, true));
    for (int part = 0; part < 2; part++) {
        const char *t = part == 0 ? rp->reasoning : rp->content;
        if (!t || (!chat && part == 0)) continue;
        size_t n = strlen(t);
        for (size_t i = 0; i < n; i += 5) {
            char piece[6] = {0};
            memcpy(piece, t + i, n - i < 5 ? n - i : 5);
            append_event(&buf, len, wrap(choice_json(rp, chat, true, false, part ? piece : NULL,
                                                     part ? NULL : piece), chat, true));
        }
    }
    append_event(&buf, len, wrap(choice_json(rp, chat, true, true, NULL, NULL), chat, true));
    buf = realloc(buf, *len + 15);
    memcpy(buf + *len, "data: [DONE]\n\n", 15);
    *len += 14;
    return buf;
}

static enum MHD_Result send_reply(struct MHD_Connection *c, const reply *rp, bool chat, bool stream)
{
    if (!stream) return send_json(c, 200, wrap(choice_json(rp, chat, false, true, rp->content, rp->reasoning), chat, false));
    size_t len;
    char *body = sse_body(rp, chat, &len);
    enum MHD_Result ok = send_text(c, 200, "text/event-stream", body, len);
    free(body);
    return ok;
}

/* FAKE_SSE_DROP: the first event, then an error that makes MHD close the connection. */
typedef struct drop_state {
    char  *first;
    size_t len;
} drop_state;

static ssize_t drop_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    drop_state *d = cls;
    if (pos < d->len) {
        size_t n = d->len - (size_t)pos < max ? d->len - (size_t)pos : max;
        memcpy(buf, d->first + pos, n);
        return (ssize_t)n;
    }
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void drop_free(void *cls)
{
    drop_state *d = cls;
    free(d->first);
    free(d);
}

static void leave_flight(fake_server *s, request_ctx *rc)
{
    pthread_mutex_lock(&s->lock);
    if (rc->counted) {
        s->in_flight--;
        rc->counted = false;
    }
    pthread_mutex_unlock(&s->lock);
}

static enum MHD_Result answer_completion(fake_server *s, struct MHD_Connection *c, request_ctx *rc, bool chat)
{
    const fake_config *cfg = &s->cfg;
    if (cfg->required_key) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        bool ok = auth && !strncmp(auth, "Bearer ", 7) && !strcmp(auth + 7, s->key);
        pthread_mutex_lock(&s->lock);
        if (ok) s->stats.auth_ok++;
        else s->stats.auth_bad++;
        pthread_mutex_unlock(&s->lock);
        if (!ok) {
            leave_flight(s, rc);
            return send_json(c, 401, json_pack("{s:{s:s}}", "error", "message", "invalid API key"));
        }
    }

    json_t *req = json_loadb(rc->body ? rc->body : "", rc->len, 0, NULL);
    const char *text = NULL, *model = NULL;
    bool stream = false;
    if (json_is_object(req)) {
        model = json_string_value(json_object_get(req, "model"));
        stream = json_is_true(json_object_get(req, "stream"));
        if (chat) {
            json_t *msgs = json_object_get(req, "messages");
            json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
            text = json_string_value(json_object_get(last, "content"));
        } else {
            text = json_string_value(json_object_get(req, "prompt"));
        }
    }
    pthread_mutex_lock(&s->lock);
    snprintf(s->stats.last_model, sizeof s->stats.last_model, "%s", model ? model : "");
    pthread_mutex_unlock(&s->lock);

    const fp4d_probe_prompt *p = fp4d_probe_prompt_find(text);
    char good[160], reasoning[200];
    snprintf(good, sizeof good, "The answer is %s.", p ? p->answers[0] : "unknown");
    snprintf(reasoning, sizeof reasoning, "The user asks a simple question. The answer is %s.",
             p ? p->answers[0] : "unknown");
    static const char bangs[] = "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!";
    reply rp = {good, NULL, "stop", NULL};

    if (cfg->delay_ms) nap(s, cfg->delay_ms);
    pthread_mutex_lock(&s->lock);
    bool crowded = s->in_flight > 1;
    pthread_mutex_unlock(&s->lock);

    switch (cfg->behavior) {
    case FAKE_HANG:
    case FAKE_HANG_ALL:
        nap(s, 120000);
        leave_flight(s, rc);
        json_decref(req);
        return MHD_NO; /* woken by stop: just close */
    case FAKE_BUSY_WHEN_CONCURRENT:
        if (!crowded) break;
        pthread_mutex_lock(&s->lock);
        s->stats.garbage_answers++;
        pthread_mutex_unlock(&s->lock);
        leave_flight(s, rc);
        json_decref(req);
        return send_json(c, 429, json_pack("{s:{s:s, s:s}}", "error", "message", "Too many requests in flight",
                                           "type", "rate_limit_exceeded"));
    case FAKE_REDIRECT: {
        leave_flight(s, rc);
        json_decref(req);
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen("Temporary Redirect"),
                                                                 (void *)"Temporary Redirect", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Location", "http://127.0.0.1:1/moved/v1/chat/completions");
        enum MHD_Result ok = MHD_queue_response(c, 307, r);
        MHD_destroy_response(r);
        return ok;
    }
    case FAKE_HTTP_500:
        leave_flight(s, rc);
        json_decref(req);
        return send_json(c, 500, json_pack("{s:{s:s, s:s, s:i}}", "error", "message",
                                           "CUDA error: an illegal memory access was encountered", "type",
                                           "InternalServerError", "code", 500));
    case FAKE_HOSTILE_TEXT:
        rp = (reply){"x\x1b]0;pwned\x07\xc2\x9b" "2J", NULL, "stop\x1b[2J", "NaN happened\x1b[31m"};
        break;
    case FAKE_HOSTILE_RAW: {
        static const char body[] = "raw \x1b[2J \x9b \xff then a NUL:\0:after the NUL";
        leave_flight(s, rc);
        json_decref(req);
        return send_text(c, 200, "application/json", body, sizeof body - 1);
    }
    case FAKE_MALFORMED_JSON: {
        static const char cut[] = "{\"id\":\"cmpl-fake\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                                  "\"assistant\",\"content\":\"The answ";
        leave_flight(s, rc);
        json_decref(req);
        return send_text(c, 200, "application/json", cut, sizeof cut - 1);
    }
    case FAKE_NAN_STOP:
        rp = (reply){"The answer", NULL, "stop", "NaN happened"};
        break;
    case FAKE_BANG_REASONING:
        rp = (reply){NULL, bangs, "length", NULL};
        break;
    case FAKE_REASONING_ONLY:
        rp = (reply){NULL, reasoning, "stop", NULL};
        break;
    case FAKE_WRONG_ANSWER:
        rp = (reply){"I believe it is banana bread.", NULL, "stop", NULL};
        break;
    case FAKE_CANNED:
        rp = (reply){"Hello! I am a test server. The answer is 7.", NULL, "stop", NULL};
        break;
    case FAKE_GARBAGE_WHEN_CONCURRENT:
        if (crowded) rp = (reply){" , , (!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!", NULL, "length", NULL};
        break;
    case FAKE_NAN_WHEN_CONCURRENT:
        if (crowded) rp = (reply){"", NULL, "stop", "NaN happened"};
        break;
    case FAKE_WRONG_WHEN_CONCURRENT:
        if (crowded) rp = (reply){"I believe it is banana bread.", NULL, "stop", NULL};
        break;
    default:
        break;
    }
    bool bad = (cfg->behavior == FAKE_GARBAGE_WHEN_CONCURRENT || cfg->behavior == FAKE_NAN_WHEN_CONCURRENT ||
                cfg->behavior == FAKE_WRONG_WHEN_CONCURRENT) && crowded;
    pthread_mutex_lock(&s->lock);
    if (bad) s->stats.garbage_answers++;
    pthread_mutex_unlock(&s->lock);
    leave_flight(s, rc);

    enum MHD_Result ok;
    if (stream && cfg->behavior == FAKE_SSE_BAD_EVENT) {
        size_t len = 0;
        char *body = NULL;
        append_event(&body, &len, wrap(choice_json(&rp, chat, true, false, "The ", NULL), chat, true));
        static const char tail[] = "data: {not json\n\ndata: [DONE]\n\n";
        body = realloc(body, len + sizeof tail);
        memcpy(body + len, tail, sizeof tail);
        len += sizeof tail - 1;
        ok = send_text(c, 200, "text/event-stream", body, len);
        free(body);
    } else if (stream && cfg->behavior == FAKE_SSE_DROP) {
        drop_state *d = calloc(1, sizeof *d);
        append_event(&d->first, &d->len, wrap(choice_json(&rp, chat, true, false, "The ", NULL), chat, true));
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, drop_reader, d, drop_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
    } else {
        ok = send_reply(c, &rp, chat, stream);
    }
    json_decref(req);
    return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    fake_server *s = cls;
    request_ctx *rc = *con_cls;
    if (!rc) {
        rc = calloc(1, sizeof *rc);
        if (!rc) return MHD_NO;
        *con_cls = rc;
        rc->is_post = !strcmp(method, "POST");
        if (rc->is_post) {
            pthread_mutex_lock(&s->lock);
            s->stats.posts++;
            s->in_flight++;
            rc->counted = true;
            if (s->in_flight > s->stats.max_in_flight) s->stats.max_in_flight = s->in_flight;
            pthread_mutex_unlock(&s->lock);
        }
        return MHD_YES;
    }
    if (rc->is_post && *upload_size) {
        rc->body = realloc(rc->body, rc->len + *upload_size + 1);
        memcpy(rc->body + rc->len, upload, *upload_size);
        rc->len += *upload_size;
        rc->body[rc->len] = '\0';
        *upload_size = 0;
        return MHD_YES;
    }

    if (s->cfg.behavior == FAKE_HANG_ALL) {
        nap(s, 120000);
        leave_flight(s, rc);
        return MHD_NO;
    }
    if (!strcmp(method, "GET")) {
        pthread_mutex_lock(&s->lock);
        if (!strcmp(url, "/health")) s->stats.health_gets++;
        else if (!strcmp(url, "/v1/models")) s->stats.models_gets++;
        else s->stats.other_gets++;
        pthread_mutex_unlock(&s->lock);
        if (!strcmp(url, "/health") && !s->cfg.no_health) return send_text(c, 200, "text/plain", "", 0);
        if (!strcmp(url, "/v1/models") && !s->cfg.no_models)
            return send_json(c, 200, json_pack("{s:s, s:[{s:s, s:s}]}", "object", "list", "data", "id",
                                               s->cfg.model_id ? s->cfg.model_id : "fake-model", "object", "model"));
        return send_json(c, 404, json_pack("{s:s}", "detail", "Not Found"));
    }
    if (rc->is_post && !strcmp(url, "/v1/chat/completions")) return answer_completion(s, c, rc, true);
    if (rc->is_post && !strcmp(url, "/v1/completions")) return answer_completion(s, c, rc, false);
    leave_flight(s, rc);
    return send_json(c, 404, json_pack("{s:s}", "detail", "Not Found"));
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    fake_server *s = cls;
    request_ctx *rc = *con_cls;
    if (!rc) return;
    leave_flight(s, rc);
    free(rc->body);
    free(rc);
    *con_cls = NULL;
}

fake_server *fake_server_start(const fake_config *cfg)
{
    fake_server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->cfg = *cfg;
    s->cfg.tls_cert_pem = s->cfg.tls_key_pem = NULL; /* only needed while starting */
    if (cfg->required_key) {
        snprintf(s->key, sizeof s->key, "%s", cfg->required_key);
        s->cfg.required_key = s->key;
    }
    pthread_mutex_init(&s->lock, NULL);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = 0; /* ephemeral */
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool tls = cfg->tls_cert_pem && cfg->tls_key_pem;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION;
    if (tls)
        s->daemon = MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR,
                                     (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                                     MHD_OPTION_HTTPS_MEM_KEY, cfg->tls_key_pem, MHD_OPTION_HTTPS_MEM_CERT,
                                     cfg->tls_cert_pem, MHD_OPTION_END);
    else
        s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                                     MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_END);
    if (!s->daemon) {
        fprintf(stderr, "fake_server: MHD_start_daemon failed\n");
        pthread_mutex_destroy(&s->lock);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : 0;
    snprintf(s->url, sizeof s->url, "%s://127.0.0.1:%u", tls ? "https" : "http", (unsigned)s->port);
    return s;
}

unsigned short fake_server_port(const fake_server *s) { return s->port; }
const char *fake_server_url(const fake_server *s) { return s->url; }

fake_stats fake_server_stats(fake_server *s)
{
    pthread_mutex_lock(&s->lock);
    fake_stats st = s->stats;
    pthread_mutex_unlock(&s->lock);
    return st;
}

void fake_server_stop(fake_server *s)
{
    if (!s) return;
    atomic_store(&s->stopping, true);
    MHD_stop_daemon(s->daemon);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
