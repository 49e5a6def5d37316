/* libFuzzer harness for tap_frame_feed: the input is cut into chunks whose sizes come from the input's
 * first bytes, in client and broker mode; every event must lie inside the input or the decoder buffer. */
#include "amqptap/frame.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	uint8_t seed = data[0];
	bool client = data[1] & 1;
	data += 2;
	size -= 2;
	struct tap_frame_dec d;
	if (client)
		tap_frame_dec_init_client(&d);
	else
		tap_frame_dec_init(&d);
	if (seed & 0x80)
		tap_frame_dec_set_frame_max(&d, 4096);
	size_t pos = 0;
	unsigned step = seed % 17 + 1;
	while (pos < size) {
		size_t chunk = step;
		step = (step * 7 + 3) % 61 + 1;
		if (chunk > size - pos)
			chunk = size - pos;
		size_t off = 0;
		while (off < chunk) {
			struct tap_frame_ev ev;
			ssize_t n = tap_frame_feed(&d, data + pos + off, chunk - off, &ev);
			if (n < 0)
				goto out;
			if ((size_t)n > chunk - off || (n == 0 && ev.kind == TAP_EV_NONE))
				abort();
			if (ev.kind != TAP_EV_NONE && ev.len) {
				volatile uint8_t sink = ev.data[0] ^ ev.data[ev.len - 1];
				(void)sink;
			}
			off += (size_t)n;
		}
		pos += chunk;
	}
out:
	tap_frame_dec_deinit(&d);
	return 0;
}
