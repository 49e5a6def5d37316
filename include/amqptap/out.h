/* Output files (--verdicts, --frames, --pcap, and stderr through log.h) that the forwarding loop never waits on.
 * The loop appends whole records to a batch; a full batch (or tap_out_flush, every 10 ms) goes into a bounded
 * in-memory backlog that one writer thread per output drains with plain blocking write()s, so a pipe nobody reads,
 * a stalled FIFO, NFS or a full disk stall only that thread. When the backlog is full, the batch is dropped whole
 * (never half a record) and counted; when writing fails, the rest of the batch is counted lost. A JSON Lines output
 * then gets a records_lost record where the gap is, and the first failure of each output goes to the log at once.
 *
 *   loop thread                         |  writer thread
 *   tap_out_line/block -> fill batch    |
 *   tap_out_flush ------> [backlog: batch, batch, reopen, ...] --> write() ... (may block forever)
 *                          <= backlog_bytes, counted while written |
 *
 * Files are created 0600; a file that exists keeps its mode (an operator's chmod survives a restart). */
#ifndef AMQPTAP_OUT_H
#define AMQPTAP_OUT_H

#include "amqptap/out_loss.h" /* enum tap_out_loss, tap_out_loss_name */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_OUT_BATCH_BYTES (64 * 1024)
#define TAP_OUT_BACKLOG_DEFAULT (8u * 1024 * 1024)
/* How long the records still in memory at shutdown may take to be written before they count as lost. */
#define TAP_OUT_FLUSH_MS 2000u

/* How records are framed, which decides what a loss leaves behind:
 * LINES: JSON Lines; a loss is marked by a records_lost record, a cut line is removed (regular file) or ended.
 * BLOCKS: binary blocks (pcapng); losses are only counted; a cut block is removed or writing stops; every file
 *         begins with the conf's head.
 * TEXT: human lines (the log); a loss is marked by a text line; any thread may write (tap_out_text). */
enum tap_out_kind {
	TAP_OUT_LINES,
	TAP_OUT_BLOCKS,
	TAP_OUT_TEXT,
};

struct tap_out_conf {
	const char *name;     /* "verdicts", "frames", "pcap": the option and the output field of records_lost */
	const char *path;     /* NULL or "-": stdout */
	enum tap_out_kind kind;
	size_t backlog_bytes; /* 0: TAP_OUT_BACKLOG_DEFAULT */
	bool private_mode;    /* a file that exists is made 0600 too (it holds secrets: the TLS key log) */
	/* BLOCKS: what every file must begin with (pcapng's tap_pcapng_head), copied. The writer writes it into each
	 * file it opens (the first, one made again after it was deleted, one reopened) as soon as it opens it, so
	 * a file without a block is a valid empty capture; and when a write failed to put it there, it is written
	 * before the next block, so no block is ever written where no reader can read it. It is no record: not
	 * counted. */
	const void *head;
	size_t head_len;
	/* LINES: the identity records_lost records carry, as every other record does (NULL: none, as in replay) */
	const char *run;
	const char *tap_id;
};

struct tap_out_stats {
	uint64_t records;                     /* handed to the output */
	uint64_t lost;                        /* the sum of lost_by */
	uint64_t lost_by[TAP_OUT_N_LOSSES];   /* by enum tap_out_loss */
	uint64_t write_errors;                /* failed write() calls */
};

struct tap_out;

/* Opens (creating 0600) or takes stdout, and starts the writer. NULL with errno set when that failed. A FIFO that
 * nobody reads yet is opened by the writer, which waits for a reader (trying every 200 ms, without blocking):
 * records wait in the backlog meanwhile, and the caller goes on at once. A LINES FIFO whose reader goes away
 * (EPIPE) is waited for the same way, and writing goes on where it stopped, the stream whole across readers. */
struct tap_out *tap_out_open(const struct tap_out_conf *conf);
/* The same on a descriptor that stays the caller's (stderr for the log); path is only used in messages. */
struct tap_out *tap_out_open_fd(const struct tap_out_conf *conf, int fd);

/* Loop thread only. One record without its newline (LINES), or one whole binary block (BLOCKS). */
void tap_out_line(struct tap_out *o, const char *data, size_t len);
void tap_out_block(struct tap_out *o, const void *data, size_t len);
/* Any thread, TEXT outputs: one or more whole lines, handed to the writer at once. With memory short they go into
 * a reserve kept for that (8 KiB, one text at a time until it is written). Returns false when they were dropped:
 * counted, and a line saying how many comes before a later text (when there is room for both) or at the close. */
bool tap_out_text(struct tap_out *o, const char *data, size_t len);
/* tap_out_text that, finding the reserve in use or the backlog full, waits for the writer until deadline_us
 * (tap_out_clock_us): the exit summary. */
bool tap_out_text_until(struct tap_out *o, const char *data, size_t len, int64_t deadline_us);

/* Loop thread: hands the batch to the writer. Waits for room in the backlog only until tap_out_wait_until's time
 * (never, by default): past it a batch that does not fit is dropped. */
void tap_out_flush(struct tap_out *o);
/* Monotonic time (tap_out_clock_us) until which tap_out_flush waits for room: INT64_MAX for replay, where nothing
 * is forwarded; the shutdown deadline once forwarding is over. */
void tap_out_wait_until(struct tap_out *o, int64_t mono_us);
/* Loop thread: the writer closes and opens the path again once what was handed before is written (SIGHUP,
 * logrotate). Never waits; a failure is logged by the writer. stdout stays. */
void tap_out_reopen(struct tap_out *o);

void tap_out_get_stats(struct tap_out *o, struct tap_out_stats *st);

/* Hands over the last batch (TEXT: the note of lines lost since the last one, waiting for the reserve if memory is
 * short) and lets the writer finish until deadline_us (monotonic); a writer still stuck then is cancelled and what
 * it had not written counts as lost. Frees o (a writer that cannot even be cancelled is left
 * behind with its memory) and fills *st (may be NULL) with the final counts. */
void tap_out_close(struct tap_out *o, int64_t deadline_us, struct tap_out_stats *st);

/* How grave an output's report of itself is (a write failed, records are dropped; a FIFO's reader came back). */
enum tap_out_report_level {
	TAP_OUT_REPORT_ERROR,
	TAP_OUT_REPORT_INFO,
};

/* Where outputs report their own failures: one line, as vprintf(fmt, ap) would write it, without "amqptap: " and
 * without "\n". Called on the loop thread and on writer threads; the writer of a TEXT output on a descriptor (the
 * log's) never reports, so the log can write reports through its own output. */
typedef void (*tap_out_report_fn)(enum tap_out_report_level level, const char *fmt, va_list ap);
/* Installs fn (NULL: reports are dropped, the default) and returns the one it replaces. main installs the log's
 * (tap_log_hear_outputs in log.h), so reports reach stderr through it; the output layer knows nothing of the log. */
tap_out_report_fn tap_out_set_report(tap_out_report_fn fn);

/* CLOCK_MONOTONIC in microseconds, for the deadlines above. */
int64_t tap_out_clock_us(void);

#endif
