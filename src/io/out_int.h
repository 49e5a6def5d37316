/* The output layer's private types, shared by its files. They call one way, each only the ones below it:
 *
 *   loop side  out.c         open and close, the append API, handing batches to the backlog (include/amqptap/out.h)
 *   writer     out_writer.c  the writer thread: takes chunks off the backlog, writes them, recovers after a failure
 *   file       out_file.c    opening the path and opening it again (SIGHUP, a deleted file, a FIFO's reader that
 *                            went away), waiting for a FIFO's reader, cutting a cut record off a file
 *   losses     out_loss.c    loss accounting by cause, the records_lost record or text line, the counts
 *   chunks     out_chunk.c   batches and their recycling, the clocks, and out_report (tap_out_set_report)
 *   types      this file
 *
 * The output reports its failures through the callback tap_out_set_report installs (the log's): it calls nothing
 * of the log, which writes stderr through it. */
#ifndef AMQPTAP_OUT_INT_H
#define AMQPTAP_OUT_INT_H

#include "amqptap/buf.h"
#include "amqptap/out.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPARE_CHUNKS 4
#define SPARE_MAX_BYTES (256 * 1024) /* a batch grown past this by one big record is freed, not kept */
#define FILL_SLACK (4 * 1024)        /* a new batch's room past TAP_OUT_BATCH_BYTES */
#define CANCEL_JOIN_MS 200
#define READER_RETRY_MS 200 /* how often a FIFO nobody reads is tried again */
#define TEXT_RESERVE_BYTES (8 * 1024) /* TEXT: room kept for lines that find no memory (the summary at exit) */
#define LOSS_NOTE_BYTES 512           /* room for a loss note (it may still grow the batch) */
#define WRITER_DOZE_US (50 * 1000)    /* how long the writer waits for more before it sleeps (see enqueue) */

/* The writer thread can be cancelled (tap_out_close) while it waits in write(), poll() or open(). A cancelled
 * thread's frames are not left the normal way, so under AddressSanitizer the redzones of their address-taken
 * locals stay poisoned, and the thread's own exit then trips over them. So the frames a cancellation can find hold
 * no such local: the cancel state is set without asking for the old one (NULL, which glibc allows), what
 * write_all writes from and polls lives in struct tap_out, and the helpers that need one (fstat) run to their end
 * out of line. */
#define OUT_OF_LINE __attribute__((noinline))

/* Where the writer is, for enqueue: waking it costs the loop thread a futex call and, on a busy machine, a context
 * switch that makes the loop forward fewer messages per read; a writer that has just written is dozing and comes back
 * by itself, so only a sleeping one is woken (or a dozing one whose backlog has grown past a quarter). */
enum writer_state {
	WRITER_BUSY,   /* writing, or about to look at the queue */
	WRITER_DOZING, /* waiting WRITER_DOZE_US for the next batch, woken only when the backlog grows */
	WRITER_ASLEEP, /* the queue stayed empty through a doze: waiting until something comes */
};

/* Whether the output closes its descriptor: stdout and stderr stay open. */
enum fd_owner {
	FD_BORROWED,
	FD_OWNED,
};

enum chunk_kind {
	CHUNK_DATA,
	CHUNK_REOPEN,
};

/* A batch of whole records, as handed from the loop to the writer. */
struct chunk {
	struct chunk *next;
	enum chunk_kind kind;
	struct tap_buf data;
	uint64_t records;
	size_t *ends; /* BLOCKS: where each record ends, to find the record a failed write cut */
	size_t ends_cap;
	bool reserve; /* the TEXT output's reserve: goes back to it once written */
};

struct tap_out {
	char *name;
	char *path; /* NULL: a descriptor the caller owns */
	enum tap_out_kind kind;
	size_t backlog_bytes;
	int fd;
	bool own_fd;
	bool pipe; /* a pipe or FIFO: written in whole records of at most PIPE_BUF bytes where it can be */
	bool private_mode; /* tap_out_conf's */
	struct tap_buf file_head; /* tap_out_conf's head (BLOCKS) */
	char *run, *tap_id;  /* tap_out_conf's (LINES), NULL: none */

	/* loop thread (TEXT: under mu) */
	struct chunk *fill;
	int64_t wait_until_us;
	uint64_t records;
	/* records lost, by cause: BACKLOG_FULL and NO_MEMORY (dropped before reaching the backlog) by this thread,
	 * WRITE_FAILED by the writer and UNFLUSHED by close, both under mu */
	uint64_t lost_by[TAP_OUT_N_LOSSES];
	uint64_t drop_unreported;   /* dropped since the last records_lost record */
	int64_t drop_first_us;
	enum tap_out_loss drop_cause; /* NO_MEMORY when some of those were for want of memory, else BACKLOG_FULL */
	bool drop_reported[TAP_OUT_N_LOSSES]; /* the log heard of the first drop, by cause */

	pthread_mutex_t mu;
	pthread_cond_t wake; /* writer: something queued, or closing */
	pthread_cond_t room; /* loop: a chunk was written, or the writer ended */
	struct chunk *head, *tail;
	size_t queued_bytes; /* including the chunk being written */
	struct chunk *spare;
	size_t n_spare;
	struct chunk *reserve; /* TEXT: a batch allocated at open for when memory runs out; NULL while in use */
	bool closing;
	bool writer_done;
	enum writer_state writer_state;
	uint64_t write_errors;
	pthread_t thread;

	/* writer thread only (read by close after join) */
	struct chunk *current;
	size_t current_off;
	bool partial;  /* a line was cut and could not be removed: the next write starts with "\n" */
	bool broken;   /* a block was cut and could not be removed: nothing more can be appended */
	bool head_due; /* the file does not begin with the head yet */
	bool made;     /* the last open_waiting made the file */
	size_t head_off;
	bool fail_reported;
	uint64_t wlost_unreported;
	int64_t wfirst_us;
	int werr;
	struct tap_buf note;
	size_t note_off;      /* how much of the note (or a cut line's end) is written */
	struct pollfd wait;   /* what write_all polls: kept off the stack (see OUT_OF_LINE) */
};

/* ---- out_chunk.c ---- */

struct chunk *out_chunk_new(void);
void out_chunk_free(struct chunk *c);
void out_chunk_reset(struct chunk *c);
/* Under mu: c back to the reserve or the spares, or freed. */
void out_chunk_recycle(struct tap_out *o, struct chunk *c);
/* Under mu: a spare, or a new one; NULL without memory. */
struct chunk *out_chunk_take(struct tap_out *o);
/* Under mu: a batch holding len bytes, taking the reserve if memory is short and it is free; NULL if neither. */
struct chunk *out_chunk_with_room(struct tap_out *o, size_t len);
uint64_t out_count_newlines(const char *p, size_t len);
/* CLOCK_REALTIME in microseconds, for the times records give. */
int64_t out_wall_us(void);
/* Hands a report to the callback tap_out_set_report installed; nothing without one. */
void out_report(enum tap_out_report_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- out_loss.c ---- */

/* A loss note into b: a records_lost record (LINES) or a line of text (TEXT) for lost records since first_us, lost
 * for cause; err: the write's errno (WRITE_FAILED), else 0. */
void out_loss_note(struct tap_buf *b, const struct tap_out *o, uint64_t lost, int64_t first_us,
		   enum tap_out_loss cause, int err);
/* Loop thread (TEXT: under mu): records dropped before they reached the backlog. */
void out_note_drop(struct tap_out *o, uint64_t records, enum tap_out_loss cause);
/* Writer thread: records a write failure lost, with the errno that stopped it. */
void out_writer_lost(struct tap_out *o, uint64_t lost, int err);
/* Under mu. */
void out_stats_locked(const struct tap_out *o, struct tap_out_stats *st);
/* Under mu, with the writer gone or stuck: the records it did not write, counting the chunk it was in from
 * current_off on (0 when the writer could not be joined and its progress is unknown). */
uint64_t out_unwritten_records(const struct tap_out *o, size_t current_off);

/* ---- out_file.c ---- */

/* open(2) flags of an output's file (and O_CREAT or not). One that holds secrets (private_mode: the TLS key log) is
 * never reached through a symbolic link, which could point it at a file of someone else's choosing: made 0600 and
 * fed keys (O_NOFOLLOW: ELOOP). Other outputs follow links, as log files commonly do. */
static inline int out_open_flags(bool private_mode)
{
	return O_WRONLY | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (private_mode ? O_NOFOLLOW : 0);
}

/* How open_path treats a missing file. */
enum open_how {
	OPEN_EXISTING, /* ENOENT */
	OPEN_NEW,      /* made (0600), and only a file this call makes: else EEXIST */
	OPEN_ANY,      /* made if missing (also a symbolic link's missing target, which OPEN_NEW refuses) */
};

OUT_OF_LINE bool out_is_fifo(int fd);
/* LINES into a FIFO the tap opened by its path: a reader that went away (EPIPE) is waited for, not written off (a
 * log shipper restarting). */
bool out_waits_for_reader(const struct tap_out *o);
/* Writer thread, after EPIPE (out_waits_for_reader): waits for a reader to open the FIFO again and goes on writing
 * there from data's *off (see out_file.c). Returns 0, or the errno of an open that failed otherwise. */
int out_reader_wait(struct tap_out *o, const char *data, size_t *off);
/* Opens the path again and writes to it from now on; false (errno set) when it cannot be opened. A FIFO without a
 * reader is waited for, where a close may cancel the writer. how: OPEN_EXISTING waits while the file is missing too
 * (a reader may make it again); OPEN_ANY makes it, and a file it makes anew gets the old one's mode. */
OUT_OF_LINE bool out_open_again(struct tap_out *o, enum open_how how);
/* Writer thread: the open tap_out_open left to it (a FIFO without a reader), waiting for a reader as long as it
 * takes. */
OUT_OF_LINE void out_open_first(struct tap_out *o);
/* Whether the file written to was deleted (no name left: what is written to it is lost to every reader). */
OUT_OF_LINE bool out_file_deleted(const struct tap_out *o);
/* Removes the first cut bytes at the end of a regular file, the start of a record a failed write cut. */
bool out_remove_cut(struct tap_out *o, size_t cut);

/* ---- out_writer.c ---- */

/* The writer thread's body (arg: the struct tap_out). */
void *out_writer_main(void *arg);

#endif
