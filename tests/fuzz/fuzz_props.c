/* libFuzzer harness for tap_props_decode and the frame-trace line writer on content headers. */
#include "amqptap/frames.h"
#include "amqptap/props.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tap_props p;
	if (tap_props_decode(data, size, &p) == 0 && p.headers.len &&
	    (p.headers.ptr < data || p.headers.ptr + p.headers.len > data + size))
		abort();
	struct tap_frame_ev ev = {
		.kind = TAP_EV_HEADER, .channel = 1, .type = 2, .size = (uint32_t)size, .data = data, .len = size,
		.frame_end = true,
	};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_frames_line(&b, NULL, 1, TAP_S2C, 0, &ev, NULL, 0);
	tap_buf_deinit(&b);
	return 0;
}
