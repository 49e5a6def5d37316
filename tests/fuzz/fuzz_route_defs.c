/* libFuzzer harness for the definitions loader: any bytes either give a finished model within its limits, which
 * then routes, or an error line and no model. */
#include "amqptap/route_defs.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tap_route_defs_limits lim;
	tap_route_defs_limits_default(&lim);
	lim.max_parse = 8u << 20;
	lim.model.max_bytes = 4u << 20;
	struct tap_route_model *m = NULL;
	char err[300];
	err[0] = 0;
	int rc = tap_route_defs_load((const char *)data, size, NULL, &lim, &m, err, sizeof err);
	if (rc) {
		if (m || !err[0])
			abort();
		return 0;
	}
	if (!m || tap_route_model_bytes(m) > lim.model.max_bytes)
		abort();
	static const char *xs[] = {"", "x", "amq.topic", "t"};
	for (size_t i = 0; i < 4; i++) {
		struct tap_route_msg msg = {.vhost = "/",
		                            .vhost_len = 1,
		                            .exchange = xs[i],
		                            .exchange_len = strlen(xs[i]),
		                            .key = "a.b",
		                            .key_len = 3};
		struct tap_route_result r;
		if (tap_route(m, &msg, &r))
			abort();
	}
	tap_route_model_free(m);
	return 0;
}
