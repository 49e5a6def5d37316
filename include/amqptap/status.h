/* Status codes shared by every module: 0 is success, failures are negative
 * and grouped in ranges (protocol, I/O, TLS, configuration) so a caller can
 * tell the layer at a glance. tap_strerror() names every one of them. */
#ifndef AMQPTAP_STATUS_H
#define AMQPTAP_STATUS_H

#define TAP_STATUS_LIST(X)                                                        \
	X(TAP_OK, 0, "success")                                                        \
	/* -0x00xx: protocol (decoder, field tables, capture files) */                 \
	X(TAP_E_BAD_PROTOCOL_HEADER, -0x0001, "not an AMQP 0-9-1 protocol header")      \
	X(TAP_E_BAD_FRAME_END, -0x0002, "frame end octet is not 0xCE")                  \
	X(TAP_E_FRAME_TOO_LARGE, -0x0003, "frame larger than the negotiated frame_max") \
	X(TAP_E_BAD_FRAME_TYPE, -0x0004, "unknown frame type")                          \
	X(TAP_E_TRUNCATED, -0x0005, "truncated frame payload or argument")              \
	X(TAP_E_UNKNOWN_METHOD, -0x0006, "unknown class or method")                     \
	X(TAP_E_UNKNOWN_CLASS, -0x0007, "unknown content class")                        \
	X(TAP_E_BAD_FIELD_TYPE, -0x0008, "unknown field-table type letter")             \
	X(TAP_E_TABLE_TOO_DEEP, -0x0009, "field table nested too deeply")               \
	X(TAP_E_UNEXPECTED_FRAME, -0x000A, "frame out of sequence for its channel")     \
	X(TAP_E_BAD_CAPTURE, -0x000B, "malformed capture file")                         \
	X(TAP_E_DECODER_STOPPED, -0x000C, "decoder stopped after an earlier error")     \
	X(TAP_E_BAD_HEARTBEAT, -0x0010, "heartbeat frame not on channel 0 or not empty") \
	X(TAP_E_BAD_PROPERTY_FLAGS, -0x0011, "unknown content property flag set")       \
	X(TAP_E_BODY_TOO_LONG, -0x0012, "content body longer than its header announced") \
	/* -0x01xx: I/O and resources */                                               \
	X(TAP_E_NOMEM, -0x0101, "out of memory")                                        \
	X(TAP_E_IO, -0x0102, "input/output error")                                      \
	X(TAP_E_CONNECT, -0x0103, "could not connect upstream")                         \
	X(TAP_E_FULL, -0x0104, "capacity limit reached")                                \
	/* -0x02xx: TLS */                                                             \
	X(TAP_E_TLS, -0x0201, "TLS error")                                              \
	X(TAP_E_TLS_VERIFY, -0x0202, "TLS peer verification failed")                    \
	/* -0x03xx: configuration */                                                   \
	X(TAP_E_USAGE, -0x0301, "invalid command line")                                 \
	X(TAP_E_BAD_ADDRESS, -0x0302, "invalid address")                                \
	X(TAP_E_BAD_NUMBER, -0x0303, "invalid number")

enum tap_status {
#define TAP_STATUS_ENUM(name, value, text) name = value,
	TAP_STATUS_LIST(TAP_STATUS_ENUM)
#undef TAP_STATUS_ENUM
};

/* A static, human-readable string for every status; "unknown status" for
 * values outside the list. */
const char *tap_strerror(int status);

/* The symbolic name ("TAP_E_TRUNCATED") of a status, or NULL. */
const char *tap_status_name(int status);

#endif
