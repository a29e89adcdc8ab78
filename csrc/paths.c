/*
 * paths.c — the DS4PY_PATHS record (paths.h). A fixed table of distinct
 * (layer, op, variant) triples under a mutex: it is only touched when the
 * switch is on, where the cost of a lock per noted call does not matter.
 */
#include "paths.h"
#include "ds4.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PATHS 4096
#define OP_LEN 48
#define VAR_LEN 160 /* the longest variant (AVX-512 K-quants, ~135 characters) whole */

typedef struct {
    int64_t layer;
    char op[OP_LEN];
    char variant[VAR_LEN];
} path_entry;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_on;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static path_entry g_paths[MAX_PATHS];
static int g_n, g_dropped;

static void check_env(void) {
    const char *v = getenv("DS4PY_PATHS");
    g_on = v && strcmp(v, "1") == 0;
}

int ds4_paths_on(void) {
    pthread_once(&g_once, check_env);
    return g_on;
}

void ds4_path_note(int64_t layer, const char *op, const char *variant) {
    if (!ds4_paths_on()) return;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < g_n; i++)
        if (g_paths[i].layer == layer && strncmp(g_paths[i].op, op, OP_LEN - 1) == 0 &&
            strncmp(g_paths[i].variant, variant, VAR_LEN - 1) == 0) {
            pthread_mutex_unlock(&g_mu);
            return;
        }
    if (g_n < MAX_PATHS) {
        path_entry *e = &g_paths[g_n++];
        e->layer = layer;
        snprintf(e->op, OP_LEN, "%s", op);
        snprintf(e->variant, VAR_LEN, "%s", variant);
    } else {
        g_dropped++;
    }
    pthread_mutex_unlock(&g_mu);
}

static int by_layer(const void *a, const void *b) {
    const path_entry *x = a, *y = b;
    /* trunk layers first in order, then the head, then the rest */
    const int64_t kx = x->layer >= 0 ? x->layer : INT64_MAX + x->layer;
    const int64_t ky = y->layer >= 0 ? y->layer : INT64_MAX + y->layer;
    if (kx != ky) return kx < ky ? -1 : 1;
    int c = strcmp(x->op, y->op);
    return c ? c : strcmp(x->variant, y->variant);
}

int64_t ds4_paths_report(char *buf, int64_t cap) {
    if (!ds4_paths_on()) {
        if (buf && cap > 0) buf[0] = 0;
        return 0;
    }
    pthread_mutex_lock(&g_mu);
    qsort(g_paths, (size_t)g_n, sizeof g_paths[0], by_layer);
    int64_t len = 0;
    for (int i = 0; i <= g_n; i++) {
        char line[OP_LEN + VAR_LEN + 48];
        int m;
        if (i == g_n) {
            if (!g_dropped) break;
            m = snprintf(line, sizeof line, "(%d more entries not recorded)\n", g_dropped);
        } else if (g_paths[i].layer >= 0) {
            m = snprintf(line, sizeof line, "layer %3lld  %-22s %s\n", (long long)g_paths[i].layer,
                         g_paths[i].op, g_paths[i].variant);
        } else {
            m = snprintf(line, sizeof line, "%-9s  %-22s %s\n",
                         g_paths[i].layer == DS4_PATH_HEAD ? "head" : "other", g_paths[i].op,
                         g_paths[i].variant);
        }
        if (buf && len + m < cap) memcpy(buf + len, line, (size_t)m + 1);
        len += m;
    }
    pthread_mutex_unlock(&g_mu);
    return len;
}
