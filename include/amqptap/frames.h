/* The --frames sink (src/DESIGN.md §5): one JSON line per decoded frame with every method argument and content
 * property, credentials always redacted. */
#ifndef AMQPTAP_FRAMES_H
#define AMQPTAP_FRAMES_H


#include "amqptap/dir.h"
#include "amqptap/frame.h"
#include "amqptap/jsonl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Appends one JSON object (no newline) for ev to out:
 *   {"ts":"…","run":"5f0c2a9e41d7","conn":3,"dir":"c2s","channel":1,"frame":"method","size":37,
 *    "method":"basic.publish","class_id":60,"method_id":40,
 *    "args":{"exchange":"x","routing_key":"k","mandatory":true,"immediate":false}}
 * "run" is the tap's run id, as on every record (NULL or "": left out, as in replay).
 * Argument keys are the XML names in snake_case; reserved-N arguments are left out; bits are booleans,
 * numbers numbers, strings strings (invalid UTF-8 as \u00XX), tables as in tap_table_to_json.
 * connection.start-ok/secure-ok `response` and connection.update-secret `new-secret` are written as
 * "<redacted N bytes>"; start-ok also gets "user" when tap_sasl_parse finds one. Methods are read in the
 * version of ev (AMQP 0-8 numbers connection.close 10/60, dialect.h).
 * Headers: "class_id", "body_size", "props" (present properties only, snake_case keys, headers as a table).
 * Bodies: call once per body frame, on the slice with frame_end set, with ev->size the frame size and the
 * first bytes collected by the caller; they are written as "body_hex" when body_prefix_len > 0.
 * Protocol header: "protocol" (the name tap_frame_protocol gives, or the hex of the 8 bytes). A payload that
 * does not decode still gets its line, with "error" (the tap_strerror text) and the method name/ids or header
 * class/body size when they were readable. */
void tap_frames_line(struct tap_buf *out, const char *run, uint64_t conn, enum tap_dir dir, int64_t ts_us,
		     const struct tap_frame_ev *ev, const uint8_t *body_prefix, size_t body_prefix_len);

#endif
