/* The reasons an output loses records for: out.h's writers (io) count them, the metrics and the summary (core)
 * name them. */
#ifndef AMQPTAP_OUT_LOSS_H
#define AMQPTAP_OUT_LOSS_H

/* Why an output lost records. The first three are the reasons its records_lost records give; UNFLUSHED records
 * were still waiting for a stuck writer when the tap stopped. */
#define TAP_OUT_LOSSES(X)                                                                                             \
	X(BACKLOG_FULL, "backlog_full") /* written slower than records came: the backlog was full */                  \
	X(NO_MEMORY, "no_memory")       /* no memory for the batch */                                                 \
	X(WRITE_FAILED, "write_failed") /* a write() failed (the rest of its batch) */                                \
	X(UNFLUSHED, "unflushed")       /* not written within TAP_OUT_FLUSH_MS of the stop */

enum tap_out_loss {
#define TAP_OUT_LOSS_ENUM(id, name) TAP_OUT_LOST_##id,
	TAP_OUT_LOSSES(TAP_OUT_LOSS_ENUM)
#undef TAP_OUT_LOSS_ENUM
	TAP_OUT_N_LOSSES
};

/* The name above, as records_lost records, metrics and the summary give it. */
static inline const char *tap_out_loss_name(enum tap_out_loss loss)
{
	switch (loss) {
#define TAP_OUT_LOSS_CASE(id, name)                                                                                   \
	case TAP_OUT_LOST_##id:                                                                                       \
		return name;
		TAP_OUT_LOSSES(TAP_OUT_LOSS_CASE)
#undef TAP_OUT_LOSS_CASE
	case TAP_OUT_N_LOSSES:
		break;
	}
	return "?";
}

#endif
