/* The routing model at size: a topic exchange with N bindings (default 10,000; keys of 3-5 words drawn from a
 * vocabulary, a quarter with '*' or '#'), then lookups of random keys. Prints the build time, the model's bytes
 * and the time per lookup; run under `valgrind --tool=callgrind` (tests/bench/README.md) for instructions per
 * lookup: the difference between a run with L lookups and one with 0, divided by L.
 * Usage: bench_route [bindings] [lookups] [words-per-level] */
#include "amqptap/route.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static size_t make_key(unsigned *seed, char *out, size_t cap, unsigned vocab, bool wild)
{
	int n = 3 + rand_r(seed) % 3;
	size_t len = 0;
	for (int i = 0; i < n; i++) {
		int w = (int)(rand_r(seed) % vocab);
		int r = wild ? rand_r(seed) % 16 : 99;
		len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? "." : "", r == 0 ? "#" : r == 1 ? "*" : "");
		if (r > 1)
			len += (size_t)snprintf(out + len, cap - len, "w%d_%d", i, w);
	}
	return len;
}

int main(int argc, char **argv)
{
	unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 10000;
	unsigned lookups = argc > 2 ? (unsigned)atoi(argv[2]) : 100000;
	unsigned vocab = argc > 3 ? (unsigned)atoi(argv[3]) : 30;
	unsigned seed = 36;
	char key[128], qn[32];
	double t0 = now();
	struct tap_route_model *m = tap_route_model_new(NULL);
	if (!m || tap_route_add_exchange(m, "/", 1, "t", 1, "topic", 5, false, NULL, 0))
		return 1;
	for (unsigned i = 0; i < n; i++) {
		int ql = snprintf(qn, sizeof qn, "q%u", i % 1000);
		size_t kl = make_key(&seed, key, sizeof key, vocab, rand_r(&seed) % 4 == 0);
		if (tap_route_add_queue(m, "/", 1, qn, (size_t)ql) ||
		    tap_route_add_binding(m, "/", 1, "t", 1, false, qn, (size_t)ql, key, kl, NULL, 0)) {
			fprintf(stderr, "%s\n", tap_route_error(m));
			return 1;
		}
	}
	if (tap_route_finish(m))
		return 1;
	double t1 = now();
	unsigned long reached = 0, routed = 0;
	for (unsigned i = 0; i < lookups; i++) {
		size_t kl = make_key(&seed, key, sizeof key, vocab, false);
		struct tap_route_msg msg = {
		    .vhost = "/", .vhost_len = 1, .exchange = "t", .exchange_len = 1, .key = key, .key_len = kl};
		struct tap_route_result r;
		if (tap_route(m, &msg, &r))
			return 1;
		reached += r.n_queues;
		routed += r.n_queues > 0;
	}
	double t2 = now();
	struct tap_route_counts c;
	tap_route_counts(m, &c);
	printf("bindings %u queues %u: build %.1f ms, model %llu bytes (%.0f per binding)\n", c.bindings, c.queues,
	       (t1 - t0) * 1e3, (unsigned long long)tap_route_model_bytes(m),
	       (double)tap_route_model_bytes(m) / (n ? n : 1));
	if (lookups)
		printf("lookups %u: %.0f ns each, %.1f %% routed, %.2f queues per lookup\n", lookups,
		       (t2 - t1) * 1e9 / lookups, 100.0 * routed / lookups, (double)reached / lookups);
	tap_route_model_free(m);
	return 0;
}
