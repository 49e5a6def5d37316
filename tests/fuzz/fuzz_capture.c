/* libFuzzer harness for the capture reader: any bytes as a pcap/pcapng file, reassembled for port 5672, with
 * callbacks that touch every delivered byte. Seeds: tests/fuzz/corpus/capture/. */
#include "amqptap/capture.h"

#include <stddef.h>
#include <stdint.h>

static void *f_open(void *ctx, uint64_t id, const char *client, const char *server, bool mid, int64_t ts)
{
	(void)ctx;
	(void)client;
	(void)server;
	(void)mid;
	(void)ts;
	return (void *)(uintptr_t)id;
}

static volatile uint8_t sink;

static void f_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	(void)ctx;
	(void)user;
	(void)dir;
	(void)ts;
	for (size_t i = 0; i < len; i++)
		sink ^= data[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tap_capture *c;
	char err[256];
	if (tap_capture_open_mem(&c, data, size, "fuzz", err, sizeof err) < 0)
		return 0;
	if (size > 0 && (data[size - 1] & 1)) /* small limits, so closing idle and surplus streams is reached */
		tap_capture_set_limits(c, 1000, 2);
	struct tap_capture_cb cb = {.open = f_open, .data = f_data};
	tap_capture_run(c, 5672, &cb, err, sizeof err);
	tap_capture_free(c);
	return 0;
}
