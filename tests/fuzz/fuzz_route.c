/* libFuzzer harness for the routing model: the input is a script that declares exchanges, queues, bindings (keys
 * with '#', '*', empty and multi-byte words; headers arguments) and policies, then routes keys. Checks: no crash, no
 * leak, the bytes stay within the limit, every queue of a result is reported once, and a topic exchange's trie
 * answer is the slow matcher's. */
#include "amqptap/route.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct in {
	const uint8_t *p;
	size_t n;
};

static uint8_t byte(struct in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

/* A short string from the input: words of a tiny alphabet so that keys meet. */
static size_t str(struct in *in, char *out, size_t cap)
{
	static const char *parts[] = {"a", "b", ".", "#", "*", "\xc3\xbc", "", "x-", "q", "ae", "^", "$", "[ab]", "|"};
	size_t len = 0, n = byte(in) % 8;
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		const char *p = parts[byte(in) % (sizeof parts / sizeof parts[0])];
		size_t pl = strlen(p);
		if (len + pl + 1 > cap)
			break;
		memcpy(out + len, p, pl);
		len += pl;
	}
	out[len] = '\0';
	return len;
}

static struct tap_route_value value(struct in *in, char *buf)
{
	switch (byte(in) % 4) {
	case 0:
		return (struct tap_route_value){.kind = TAP_RV_INT, .type = 'l', .i = byte(in) % 3};
	case 1:
		return (struct tap_route_value){.kind = TAP_RV_FLOAT, .type = 'd', .d = (byte(in) % 3) * 0.5};
	case 2:
		return (struct tap_route_value){.kind = TAP_RV_BOOL, .type = 't', .b = byte(in) & 1};
	default: {
		size_t l = str(in, buf, 16);
		return (struct tap_route_value){.kind = TAP_RV_STR, .type = 'S', .s = buf, .len = (uint32_t)l};
	}
	}
}

static const char *types[] = {"direct", "fanout", "topic", "headers", "x-other"};
static const char *xm[] = {"all", "any", "all-with-x", "any-with-x"};

/* One topic exchange with the binding keys seen, one queue each: the trie's queues are the slow matcher's. */
static void topic_check(char keys[][64], int n, const char *rk, size_t rl)
{
	struct tap_route_model *t = tap_route_model_new(NULL);
	char qn[8];
	if (!t || tap_route_add_exchange(t, "/", 1, "t", 1, "topic", 5, false, NULL, 0))
		abort();
	for (int i = 0; i < n; i++) {
		snprintf(qn, sizeof qn, "%c", 'A' + i);
		if (tap_route_add_queue(t, "/", 1, qn, 1) ||
		    tap_route_add_binding(t, "/", 1, "t", 1, false, qn, 1, keys[i], strlen(keys[i]), NULL, 0))
			abort();
	}
	if (tap_route_finish(t))
		abort();
	struct tap_route_msg msg = {
	    .vhost = "/", .vhost_len = 1, .exchange = "t", .exchange_len = 1, .key = rk, .key_len = rl};
	struct tap_route_result r;
	if (tap_route(t, &msg, &r))
		abort();
	bool got[16] = {0};
	for (uint32_t i = 0; i < r.n_queues; i++) {
		size_t len;
		got[tap_route_queue_name(t, r.queues[i], &len)[0] - 'A'] = true;
	}
	char why[200];
	for (int i = 0; i < n; i++)
		if (got[i] != tap_route_topic_match(keys[i], strlen(keys[i]), rk, rl, why, sizeof why))
			abort();
	tap_route_model_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = {data, size};
	struct tap_route_limits l;
	tap_route_limits_default(&l);
	l.max_bytes = 4u << 20;
	struct tap_route_model *m = tap_route_model_new(&l);
	if (!m)
		return 0;
	char a[64], b[64], k[64], vb[8][16];
	int n_ex = 0, n_q = 0, n_keys = 0;
	char keys[16][64];
	/* the build script: at most 64 steps */
	for (int step = 0; step < 64 && in.n; step++) {
		uint8_t op = byte(&in) % 5;
		int rc = 0;
		if (op == 0 || n_ex == 0) {
			snprintf(a, sizeof a, "e%d", n_ex++);
			bool has_ae = byte(&in) & 1;
			snprintf(b, sizeof b, "e%d", byte(&in) % 8);
			const char *t = types[byte(&in) % 5];
			rc = tap_route_add_exchange(m, "/", 1, a, strlen(a), t, strlen(t), byte(&in) % 8 == 0,
			                            has_ae ? b : NULL, strlen(b));
		} else if (op == 1 || n_q == 0) {
			snprintf(a, sizeof a, "q%d", n_q++);
			rc = tap_route_add_queue(m, "/", 1, a, strlen(a));
		} else if (op == 2 || op == 3) {
			snprintf(a, sizeof a, "e%d", byte(&in) % n_ex);
			bool to_ex = byte(&in) % 4 == 0;
			if (to_ex)
				snprintf(b, sizeof b, "e%d", byte(&in) % n_ex);
			else
				snprintf(b, sizeof b, "q%d", byte(&in) % n_q);
			size_t kl = str(&in, k, sizeof k);
			struct tap_route_field f[8];
			size_t nf = byte(&in) % 4;
			char names[8][4];
			for (size_t i = 0; i < nf; i++) {
				snprintf(names[i], sizeof names[i], "%c", (char)('a' + (int)(i % 3)));
				if (i == 0)
					f[i] = (struct tap_route_field){
					    .key = "x-match",
					    .key_len = 7,
					    .v = {.kind = TAP_RV_STR, .type = 'S', .s = xm[byte(&in) % 4]}};
				else
					f[i] = (struct tap_route_field){
					    .key = names[i], .key_len = 1, .v = value(&in, vb[i])};
				if (i == 0)
					f[i].v.len = (uint32_t)strlen(f[i].v.s);
			}
			rc = tap_route_add_binding(m, "/", 1, a, strlen(a), to_ex, b, strlen(b), k, kl, f, nf);
			if (n_keys < 16)
				memcpy(keys[n_keys++], k, kl + 1);
		} else {
			size_t pl = str(&in, k, sizeof k);
			snprintf(b, sizeof b, "e%d", byte(&in) % 8);
			rc = tap_route_add_policy(m, "/", 1, "p", 1, k, pl, byte(&in) & 1 ? "exchanges" : "all",
			                          byte(&in) % 4, b, strlen(b));
		}
		if (rc) {
			tap_route_model_free(m);
			return 0;
		}
	}
	if (tap_route_finish(m)) {
		tap_route_model_free(m);
		return 0;
	}
	if (tap_route_model_bytes(m) > l.max_bytes)
		abort();
	while (in.n) {
		snprintf(a, sizeof a, "e%d", byte(&in) % (n_ex + 1));
		size_t kl = str(&in, k, sizeof k);
		struct tap_route_field h[4];
		char hn[4][2];
		size_t nh = byte(&in) % 4;
		for (size_t i = 0; i < nh; i++) {
			hn[i][0] = (char)('a' + byte(&in) % 3);
			hn[i][1] = 0;
			h[i] = (struct tap_route_field){.key = hn[i], .key_len = 1, .v = value(&in, vb[4 + i])};
		}
		struct tap_route_msg msg = {.vhost = "/",
		                            .vhost_len = 1,
		                            .exchange = a,
		                            .exchange_len = strlen(a),
		                            .key = k,
		                            .key_len = kl,
		                            .headers = h,
		                            .n_headers = nh};
		struct tap_route_result r;
		if (tap_route(m, &msg, &r))
			continue;
		for (uint32_t i = 0; i < r.n_queues; i++)
			for (uint32_t j = i + 1; j < r.n_queues; j++)
				if (r.queues[i] == r.queues[j])
					abort();
		topic_check(keys, n_keys, k, kl);
	}
	tap_route_model_free(m);
	return 0;
}
