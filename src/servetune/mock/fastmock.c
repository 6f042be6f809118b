/*
 * fastmock: a tiny OpenAI-compatible streaming server for measuring the *client's*
 * ceiling (benchmarks/client_ceiling.py). The Python mock saturates near 750 req/s on
 * one core, well below what the client can send, so the ceiling would measure the mock.
 * This one is a single-threaded epoll loop with one min-heap of deadlines: it costs a few
 * microseconds of CPU per streamed chunk, so the client is what runs out first.
 *
 * Built at benchmark time with the system C compiler (servetune.mock.fast.build).
 * Usage: fastmock [--host H] [--port P] [--ttft-ms 5] [--itl-ms 1] [--output-tokens N]
 *                 [--prompt-tokens 16]
 * Prints "mock server listening on http://H:P" once bound.
 *
 * Timing contract (what a client's numbers are checked against): the first content chunk
 * leaves no earlier than ttft after the whole request was read, each later one no earlier
 * than itl after the previous (deadlines are monotonic-clock absolute; never early).
 * Like vLLM, the headers go out at once and the chat role-only chunk goes out together
 * with the first token. Everything due at the same instant goes out in one write.
 * Streams only what the ceiling needs: POST /v1/chat/completions and /v1/completions
 * (stream or not, include_usage honoured; an answer runs --output-tokens, the model's own
 * length, capped by the request's max_completion_tokens / max_tokens, as the Python mock's
 * does; with neither the cap, else 16; finish_reason "length" at the cap, else "stop"),
 * GET /v1/models, /health and /metrics (mock:num_requests_running ...).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_FD 65536
#define OUT_CAP (1 << 17)

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

typedef struct {
    int open, busy, chat, stream, usage, n_tokens, sent;
    int capped; /* the request set max_tokens: its end is "length", else "stop" */
    uint32_t gen;
    Buf in, pending; /* request bytes; output the socket did not take yet */
} Conn;

typedef struct {
    int64_t at;
    int fd;
    uint32_t gen;
} Timer;

static Conn *conns[MAX_FD];
static Timer *heap;
static size_t heap_len, heap_cap;
static int epfd;
static int64_t ttft_ns = 5000000, itl_ns = 1000000;
static int default_tokens = 0, prompt_tokens = 16; /* 0: no --output-tokens given */
static long st_running, st_requests, st_cancelled, st_tokens;
static char out[OUT_CAP];
static size_t out_len;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void buf_add(Buf *b, const char *p, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

/* --- min-heap of deadlines ------------------------------------------------------- */
static void heap_push(int64_t at, int fd, uint32_t gen) {
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, heap_cap * sizeof(Timer));
        if (!heap) abort();
    }
    size_t i = heap_len++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (heap[parent].at <= at) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = (Timer){at, fd, gen};
}

static Timer heap_pop(void) {
    Timer top = heap[0], last = heap[--heap_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= heap_len) break;
        if (c + 1 < heap_len && heap[c + 1].at < heap[c].at) c++;
        if (last.at <= heap[c].at) break;
        heap[i] = heap[c];
        i = c;
    }
    if (heap_len) heap[i] = last;
    return top;
}

/* --- output ---------------------------------------------------------------------- */
static void out_raw(const char *p, size_t n) {
    if (out_len + n > OUT_CAP) abort();
    memcpy(out + out_len, p, n);
    out_len += n;
}

static void out_fmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + out_len, OUT_CAP - out_len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= OUT_CAP - out_len) abort();
    out_len += (size_t)n;
}

/* One SSE event `data: <payload>\n\n` as one HTTP/1.1 chunk. */
static void out_event(const char *fmt, ...) {
    char payload[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(payload, sizeof payload, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof payload) abort();
    out_fmt("%x\r\ndata: %s\n\n\r\n", n + 8, payload);
}

static void conn_close(int fd);

static void set_events(int fd, uint32_t ev) {
    struct epoll_event e = {.events = ev, .data.fd = fd};
    epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &e);
}

/* Send what `out` holds now; what the socket refuses waits for EPOLLOUT. */
static void flush_out(int fd) {
    Conn *c = conns[fd];
    size_t off = 0;
    if (!c->pending.len) {
        while (off < out_len) {
            ssize_t k = send(fd, out + off, out_len - off, MSG_NOSIGNAL);
            if (k > 0) {
                off += (size_t)k;
            } else if (k < 0 && errno == EINTR) {
                continue;
            } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            } else {
                out_len = 0;
                conn_close(fd);
                return;
            }
        }
    }
    if (off < out_len) {
        if (!c->pending.len) set_events(fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP);
        buf_add(&c->pending, out + off, out_len - off);
    }
    out_len = 0;
}

static void on_writable(int fd) {
    Conn *c = conns[fd];
    size_t off = 0;
    while (off < c->pending.len) {
        ssize_t k = send(fd, c->pending.p + off, c->pending.len - off, MSG_NOSIGNAL);
        if (k > 0) {
            off += (size_t)k;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            break;
        } else {
            conn_close(fd);
            return;
        }
    }
    memmove(c->pending.p, c->pending.p + off, c->pending.len - off);
    c->pending.len -= off;
    if (!c->pending.len) set_events(fd, EPOLLIN | EPOLLRDHUP);
}

static void respond(int fd, int status, const char *reason, const char *ctype, const char *body) {
    out_fmt("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Connection: keep-alive\r\n\r\n%s",
            status, reason, ctype, strlen(body), body);
    flush_out(fd);
}

/* --- requests -------------------------------------------------------------------- */
static int json_bool(const char *body, const char *key) {
    const char *p = strstr(body, key);
    if (!p) return 0;
    p += strlen(key);
    while (*p == ' ' || *p == ':') p++;
    return *p == 't';
}

static int json_int(const char *body, const char *key, int dflt) {
    const char *p = strstr(body, key);
    if (!p) return dflt;
    p += strlen(key);
    while (*p == ' ' || *p == ':') p++;
    int v = atoi(p);
    return v > 0 ? v : dflt;
}

static void finish_request(Conn *c) {
    c->busy = 0;
    st_running--;
}

static void try_parse(int fd);

static void start_generation(int fd, int chat, const char *body) {
    Conn *c = conns[fd];
    c->busy = 1;
    c->chat = chat;
    c->stream = json_bool(body, "\"stream\"");
    c->usage = json_bool(body, "\"include_usage\"");
    int n = json_int(body, "\"max_completion_tokens\"", 0);
    if (!n) n = json_int(body, "\"max_tokens\"", 0);
    int own = default_tokens ? default_tokens : (n ? n : 16); /* the model's own end */
    c->n_tokens = n && n < own ? n : own;
    c->capped = n > 0 && c->n_tokens >= n;
    c->sent = 0;
    st_running++;
    st_requests++;
    int64_t t = now_ns();
    if (c->stream) {
        out_fmt("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                "Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n");
        flush_out(fd);
        heap_push(t + ttft_ns, fd, c->gen);
    } else {
        heap_push(t + ttft_ns + (int64_t)c->n_tokens * itl_ns, fd, c->gen);
    }
}

static void plain_answer(int fd) {
    Conn *c = conns[fd];
    static char text[1 << 16];
    size_t len = 0;
    for (int i = 0; i < c->n_tokens && len < sizeof text - 16; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%sw%d", i ? " " : "", i % 4096);
    text[len] = 0;
    const char *finish = c->capped ? "length" : "stop";
    char *body = malloc(len + 512);
    if (!body) abort();
    if (c->chat)
        sprintf(body,
                "{\"id\":\"m\",\"object\":\"chat.completion\",\"model\":\"mock\",\"choices\":[{\"index\":0,"
                "\"message\":{\"role\":\"assistant\",\"content\":\"%s\"},\"finish_reason\":\"%s\"}],"
                "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                text, finish, prompt_tokens, c->n_tokens, prompt_tokens + c->n_tokens);
    else
        sprintf(body,
                "{\"id\":\"m\",\"object\":\"text_completion\",\"model\":\"mock\",\"choices\":[{\"index\":0,"
                "\"text\":\"%s\",\"finish_reason\":\"%s\"}],"
                "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                text, finish, prompt_tokens, c->n_tokens, prompt_tokens + c->n_tokens);
    st_tokens += c->n_tokens;
    finish_request(c);
    size_t blen = strlen(body);
    if (blen + 256 > OUT_CAP) abort();
    respond(fd, 200, "OK", "application/json", body);
    free(body);
}

/* A deadline came: the next token (plus, at the end, usage, [DONE] and the last chunk). */
static void step(int fd) {
    Conn *c = conns[fd];
    if (!c->stream) {
        plain_answer(fd);
        if (conns[fd]->open) try_parse(fd);
        return;
    }
    int i = c->sent++;
    int last = c->sent >= c->n_tokens;
    const char *fr = !last ? "null" : c->capped ? "\"length\"" : "\"stop\"";
    st_tokens++;
    if (c->chat) {
        if (i == 0)
            out_event("{\"id\":\"m\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"mock\","
                      "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
                      "\"finish_reason\":null}]}");
        out_event("{\"id\":\"m\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"mock\","
                  "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" w%d\"},\"finish_reason\":%s}]}",
                  i % 4096, fr);
    } else {
        out_event("{\"id\":\"m\",\"object\":\"text_completion\",\"created\":0,\"model\":\"mock\","
                  "\"choices\":[{\"index\":0,\"text\":\" w%d\",\"finish_reason\":%s}]}",
                  i % 4096, fr);
    }
    if (!last) {
        flush_out(fd);
        if (conns[fd]->open) heap_push(now_ns() + itl_ns, fd, c->gen);
        return;
    }
    if (c->usage)
        out_event("{\"id\":\"m\",\"object\":\"%s\",\"created\":0,\"model\":\"mock\",\"choices\":[],"
                  "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                  c->chat ? "chat.completion.chunk" : "text_completion", prompt_tokens,
                  c->n_tokens, prompt_tokens + c->n_tokens);
    static const char done[] = "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
    out_raw(done, sizeof done - 1);
    finish_request(c);
    flush_out(fd);
    if (conns[fd]->open) try_parse(fd);
}

/* Parse one whole request from the input buffer (if there is one) and act on it. */
static void try_parse(int fd) {
    Conn *c = conns[fd];
    if (c->busy || !c->in.len) return;
    c->in.p[c->in.len] = 0;
    char *end = strstr(c->in.p, "\r\n\r\n");
    if (!end) return;
    size_t head_len = (size_t)(end - c->in.p) + 4;
    long clen = 0;
    for (char *p = c->in.p; p < end; p++) {
        if ((*p == '\n') && strncasecmp(p + 1, "content-length:", 15) == 0) {
            clen = atol(p + 16);
            break;
        }
    }
    if (clen < 0 || c->in.len < head_len + (size_t)clen) return;
    size_t total = head_len + (size_t)clen;
    char saved = c->in.p[total];
    c->in.p[total] = 0;
    char *body = c->in.p + head_len;
    char method[8] = {0}, path[256] = {0};
    sscanf(c->in.p, "%7s %255s", method, path);
    char *q = strchr(path, '?');
    if (q) *q = 0;
    int chat = strcmp(path, "/v1/chat/completions") == 0;
    if (strcmp(method, "POST") == 0 && (chat || strcmp(path, "/v1/completions") == 0)) {
        start_generation(fd, chat, body);
    } else if (strcmp(path, "/v1/models") == 0 || strcmp(path, "/health") == 0) {
        respond(fd, 200, "OK", "application/json",
                "{\"object\":\"list\",\"data\":[{\"id\":\"mock\",\"object\":\"model\"}]}");
    } else if (strcmp(path, "/metrics") == 0) {
        char m[512];
        snprintf(m, sizeof m,
                 "# TYPE mock:num_requests_running gauge\nmock:num_requests_running %ld\n"
                 "# TYPE mock:requests_total counter\nmock:requests_total %ld\n"
                 "# TYPE mock:requests_cancelled_total counter\nmock:requests_cancelled_total %ld\n"
                 "# TYPE mock:generation_tokens_total counter\nmock:generation_tokens_total %ld\n",
                 st_running, st_requests, st_cancelled, st_tokens);
        respond(fd, 200, "OK", "text/plain", m);
    } else {
        respond(fd, 404, "Not Found", "application/json", "{\"error\":{\"message\":\"no route\"}}");
    }
    if (!conns[fd]->open) return;
    c->in.p[total] = saved;
    memmove(c->in.p, c->in.p + total, c->in.len - total);
    c->in.len -= total;
    if (!c->busy) try_parse(fd);
}

static void conn_close(int fd) {
    Conn *c = conns[fd];
    if (!c->open) return;
    if (c->busy) {  /* the client went away mid-answer: the "slot" is freed */
        st_cancelled++;
        finish_request(c);
    }
    c->open = 0;
    c->gen++;
    c->in.len = c->pending.len = 0;
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
}

static void on_readable(int fd) {
    Conn *c = conns[fd];
    char tmp[65536];
    for (;;) {
        ssize_t k = recv(fd, tmp, sizeof tmp, 0);
        if (k > 0) {
            if (c->in.len + (size_t)k > (1u << 24)) {  /* 16 MiB without a request: drop */
                conn_close(fd);
                return;
            }
            buf_add(&c->in, tmp, (size_t)k);
            if ((size_t)k < sizeof tmp) break;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else {
            conn_close(fd);
            return;
        }
    }
    try_parse(fd);
}

static void on_accept(int lfd) {
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        if (fd >= MAX_FD) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (!conns[fd]) {
            conns[fd] = calloc(1, sizeof(Conn));
            if (!conns[fd]) abort();
        }
        Conn *c = conns[fd];
        c->open = 1;
        c->busy = 0;
        c->in.len = c->pending.len = 0;
        struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
        epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e);
    }
}

static double arg_num(int argc, char **argv, const char *name, double dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return atof(argv[i + 1]);
    return dflt;
}

static const char *arg_str(int argc, char **argv, const char *name, const char *dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return dflt;
}

int main(int argc, char **argv) {
    const char *host = arg_str(argc, argv, "--host", "127.0.0.1");
    int port = (int)arg_num(argc, argv, "--port", 0);
    ttft_ns = (int64_t)(arg_num(argc, argv, "--ttft-ms", 5.0) * 1e6);
    itl_ns = (int64_t)(arg_num(argc, argv, "--itl-ms", 1.0) * 1e6);
    default_tokens = (int)arg_num(argc, argv, "--output-tokens", 0);
    prompt_tokens = (int)arg_num(argc, argv, "--prompt-tokens", 16);
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max < MAX_FD ? rl.rlim_max : MAX_FD;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "fastmock: bad --host %s (IPv4 only)\n", host);
        return 2;
    }
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 4096)) {
        perror("fastmock: bind/listen");
        return 1;
    }
    socklen_t alen = sizeof addr;
    getsockname(lfd, (struct sockaddr *)&addr, &alen);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.fd = lfd};
    epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &le);
    printf("mock server listening on http://%s:%d\n", host, ntohs(addr.sin_port));
    fflush(stdout);

    struct epoll_event evs[512];
    for (;;) {
        struct timespec ts, *tp = NULL;
        if (heap_len) {
            int64_t wait = heap[0].at - now_ns();
            if (wait < 0) wait = 0;
            ts.tv_sec = wait / 1000000000LL;
            ts.tv_nsec = wait % 1000000000LL;
            tp = &ts;
        }
        int n = epoll_pwait2(epfd, evs, 512, tp, NULL);
        if (n < 0 && errno != EINTR) {
            perror("fastmock: epoll");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            uint32_t ev = evs[i].events;
            if (fd == lfd) {
                on_accept(lfd);
                continue;
            }
            if (!conns[fd] || !conns[fd]->open) continue;
            if (ev & EPOLLOUT) on_writable(fd);
            if (conns[fd]->open && (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
                on_readable(fd);
        }
        int64_t t = now_ns();
        while (heap_len && heap[0].at <= t) {
            Timer tm = heap_pop();
            Conn *c = conns[tm.fd];
            if (c && c->open && c->gen == tm.gen && c->busy) step(tm.fd);
        }
    }
}
