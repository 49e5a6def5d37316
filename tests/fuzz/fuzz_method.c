/* libFuzzer harness for tap_method_decode (0-9-1 and, on the same input, AMQP 0-8 through dialect.h) and the
 * frame-trace line writer on method payloads. */
#include "amqptap/dialect.h"
#include "amqptap/frames.h"
#include "amqptap/spec.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tap_method m;
	if (tap_method_decode(data, size, &m) == 0) {
		for (unsigned i = 0; i < m.def->nargs; i++)
			if (m.args[i].ptr && (m.args[i].ptr < data || m.args[i].ptr + m.args[i].len > data + size))
				abort();
	}
	struct tap_frame_ev ev = {
		.kind = TAP_EV_METHOD, .channel = 1, .type = 1, .size = (uint32_t)size, .data = data, .len = size,
		.frame_end = true,
	};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_frames_line(&b, NULL, 1, TAP_C2S, 0, &ev, NULL, 0);
	if (tap_dialect_method_decode(TAP_AMQP_0_8, data, size, &m) == 0) {
		for (unsigned i = 0; i < m.def->nargs; i++)
			if (m.args[i].ptr && (m.args[i].ptr < data || m.args[i].ptr + m.args[i].len > data + size))
				abort();
	}
	ev.version = TAP_AMQP_0_8;
	tap_frames_line(&b, NULL, 1, TAP_C2S, 0, &ev, NULL, 0);
	tap_buf_deinit(&b);
	return 0;
}
