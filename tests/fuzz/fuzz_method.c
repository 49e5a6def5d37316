/* libFuzzer harness for tap_method_decode and the frame-trace line writer on method payloads. */
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
	struct tap_frame_ev ev = {TAP_EV_METHOD, 1, 1, (uint32_t)size, 0, data, size, true};
	struct tap_buf b;
	tap_buf_init(&b);
	tap_frames_line(&b, 1, true, 0, &ev, NULL, 0);
	tap_buf_deinit(&b);
	return 0;
}
