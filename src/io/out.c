/* Output files written by one thread each, so the forwarding loop never waits on a write. See
 * include/amqptap/out.h for the model and out_int.h for how the layer is split; this file is the loop side: opening
 * and closing an output, the append API, and handing batches over to the backlog its writer drains. */
#include "out_int.h"

#include "amqptap/thread.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Under mu: a new batch to fill, allocated at the size it is handed over at (plus room for the record that takes
 * it past), not doubled up to it; a recycled one keeps its capacity. */
static struct chunk *fill_take(struct tap_out *o)
{
	struct chunk *c = out_chunk_take(o);
	if (c)
		tap_buf_presize(&c->data, TAP_OUT_BATCH_BYTES + FILL_SLACK);
	return c;
}

/* Under mu: the writer looks at the queue now, whatever it was doing. For whoever waits on it (room, close). */
static void writer_hurry(struct tap_out *o)
{
	o->writer_state = WRITER_BUSY;
	pthread_cond_signal(&o->wake);
}

/* Under mu. */
static void enqueue(struct tap_out *o, struct chunk *c)
{
	c->next = NULL;
	if (o->tail)
		o->tail->next = c;
	else
		o->head = c;
	o->tail = c;
	o->queued_bytes += c->data.len;
	if (o->writer_state == WRITER_ASLEEP ||
	    (o->writer_state == WRITER_DOZING && o->queued_bytes >= o->backlog_bytes / 4))
		writer_hurry(o);
}

/* ---- open and close ---- */

static void out_free(struct tap_out *o)
{
	struct chunk *c = o->head;
	while (c) {
		struct chunk *next = c->next;
		out_chunk_free(c);
		c = next;
	}
	c = o->spare;
	while (c) {
		struct chunk *next = c->next;
		out_chunk_free(c);
		c = next;
	}
	out_chunk_free(o->fill);
	out_chunk_free(o->reserve);
	out_chunk_free(o->current);
	tap_buf_deinit(&o->note);
	tap_buf_deinit(&o->file_head);
	pthread_cond_destroy(&o->wake);
	pthread_cond_destroy(&o->room);
	pthread_mutex_destroy(&o->mu);
	free(o->name);
	free(o->path);
	free(o->run);
	free(o->tap_id);
	free(o);
}

/* glibc loads the unwinder pthread_cancel needs (libgcc_s) at the first cancel, and aborts the process when that
 * load finds no memory ("libgcc_s.so.1 must be installed for pthread_cancel to work"): a stuck writer cancelled at
 * a stop while memory was short took the summary and the exit status with it. backtrace() loads the same unwinder
 * and, should that fail, just returns 0: called at the first open, while memory is whole, it loads it for good. */
static void load_unwinder(void)
{
	void *pc;
	(void)backtrace(&pc, 1);
}

static struct tap_out *out_new(const struct tap_out_conf *conf, int fd, enum fd_owner owner)
{
	static pthread_once_t unwinder = PTHREAD_ONCE_INIT;
	pthread_once(&unwinder, load_unwinder);
	struct tap_out *o = calloc(1, sizeof *o);
	if (!o)
		return NULL;
	o->name = strdup(conf->name ? conf->name : "output");
	o->path = conf->path && strcmp(conf->path, "-") != 0 ? strdup(conf->path) : NULL;
	o->kind = conf->kind;
	o->backlog_bytes = conf->backlog_bytes ? conf->backlog_bytes : TAP_OUT_BACKLOG_DEFAULT;
	o->fd = fd;
	o->own_fd = owner == FD_OWNED;
	o->private_mode = conf->private_mode;
	o->pipe = out_is_fifo(fd);
	o->fill = conf->kind == TAP_OUT_TEXT ? out_chunk_new() : fill_take(o); /* nobody else sees o yet: no lock */
	if (conf->kind == TAP_OUT_TEXT && (o->reserve = out_chunk_new()) != NULL) {
		o->reserve->reserve = true;
		tap_buf_presize(&o->reserve->data, TEXT_RESERVE_BYTES);
	}
	bool reserved = conf->kind != TAP_OUT_TEXT || (o->reserve && o->reserve->data.cap >= TEXT_RESERVE_BYTES);
	tap_buf_init(&o->note);
	tap_buf_init(&o->file_head);
	if (conf->kind == TAP_OUT_BLOCKS && conf->head_len)
		tap_buf_append(&o->file_head, conf->head, conf->head_len);
	o->head_due = o->file_head.len > 0;
	o->run = conf->run ? strdup(conf->run) : NULL;
	o->tap_id = conf->tap_id ? strdup(conf->tap_id) : NULL;
	pthread_mutex_init(&o->mu, NULL);
	tap_cond_init_mono(&o->wake);
	tap_cond_init_mono(&o->room);
	bool copied = !o->file_head.oom && (!conf->run || o->run) && (!conf->tap_id || o->tap_id);
	if (!o->name || (conf->path && strcmp(conf->path, "-") != 0 && !o->path) || !o->fill || !reserved || !copied) {
		out_free(o);
		errno = ENOMEM;
		return NULL;
	}
	char thread_name[32];
	snprintf(thread_name, sizeof thread_name, "out:%s", o->name);
	int rc = tap_thread_start(&o->thread, out_writer_main, o, thread_name);
	if (rc != 0) {
		out_free(o);
		errno = rc;
		return NULL;
	}
	return o;
}

struct tap_out *tap_out_open(const struct tap_out_conf *conf)
{
	if (!conf->path || strcmp(conf->path, "-") == 0)
		return out_new(conf, STDOUT_FILENO, FD_BORROWED);
	/* never waiting here: a FIFO without a reader refuses a non-blocking open (ENXIO), and the writer waits */
	int fd = open(conf->path, out_open_flags(conf->private_mode) | O_CREAT, 0600);
	if (fd < 0 && errno == ENXIO) {
		out_report(TAP_OUT_REPORT_INFO,
			   "--%s %s: a FIFO nobody reads yet: records wait for a reader in the backlog", conf->name,
			   conf->path);
		return out_new(conf, -1, FD_OWNED);
	}
	if (fd < 0)
		return NULL;
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 || (conf->private_mode && fchmod(fd, 0600) < 0)) {
		int saved = errno;
		close(fd);
		errno = saved;
		return NULL;
	}
	struct tap_out *o = out_new(conf, fd, FD_OWNED);
	if (!o) {
		int saved = errno;
		close(fd);
		errno = saved;
	}
	return o;
}

struct tap_out *tap_out_open_fd(const struct tap_out_conf *conf, int fd)
{
	return out_new(conf, fd, FD_BORROWED);
}

/* ---- the loop side ---- */

/* Under mu: whether len more bytes fit, after waiting for room as long as allowed. */
static bool room_for(struct tap_out *o, size_t len)
{
	for (;;) {
		if (o->queued_bytes == 0 || o->queued_bytes + len <= o->backlog_bytes)
			return true;
		if (o->writer_done || o->wait_until_us <= 0)
			return false;
		writer_hurry(o);
		if (o->wait_until_us == INT64_MAX) {
			pthread_cond_wait(&o->room, &o->mu);
			continue;
		}
		if (tap_out_clock_us() >= o->wait_until_us)
			return false;
		struct timespec ts = tap_mono_abs(o->wait_until_us);
		pthread_cond_timedwait(&o->room, &o->mu, &ts);
	}
}

/* Under mu: waits for the writer to finish a chunk (the reserve may be back), until deadline_us; false, without
 * waiting, once the deadline has passed or the writer has ended. */
static bool written_until(struct tap_out *o, int64_t deadline_us)
{
	if (o->writer_done || tap_out_clock_us() >= deadline_us)
		return false;
	writer_hurry(o);
	struct timespec until = tap_mono_abs(deadline_us);
	pthread_cond_timedwait(&o->room, &o->mu, &until);
	return true;
}

/* Under mu: a loss note before the next records, in its own chunk, if losses are unreported and it fits. Returns
 * whether none is left unreported. */
static bool queue_drop_note(struct tap_out *o)
{
	if (o->drop_unreported == 0 || o->kind == TAP_OUT_BLOCKS)
		return true;
	struct chunk *n = out_chunk_with_room(o, LOSS_NOTE_BYTES);
	if (!n)
		return false;
	out_loss_note(&n->data, o, o->drop_unreported, o->drop_first_us, o->drop_cause, 0);
	if (n->data.oom || !room_for(o, n->data.len)) {
		out_chunk_recycle(o, n);
		return false;
	}
	enqueue(o, n);
	o->drop_unreported = 0;
	return true;
}

/* Under mu: hands the fill batch over (or drops it whole) and starts a new one. */
static void hand_over(struct tap_out *o)
{
	struct chunk *c = o->fill;
	if (!c) {
		o->fill = fill_take(o);
		return;
	}
	if (c->records == 0) { /* by records, not bytes: a batch whose first append found no memory holds records */
		queue_drop_note(o);
		return;
	}
	bool no_memory = c->data.oom || (o->kind == TAP_OUT_BLOCKS && c->ends == NULL);
	if (no_memory || !room_for(o, c->data.len)) {
		out_note_drop(o, c->records, no_memory ? TAP_OUT_LOST_NO_MEMORY : TAP_OUT_LOST_BACKLOG_FULL);
		out_chunk_reset(c);
		return;
	}
	queue_drop_note(o);
	enqueue(o, c);
	o->fill = fill_take(o);
}

void tap_out_flush(struct tap_out *o)
{
	if (o->kind == TAP_OUT_TEXT)
		return; /* text is handed over as it comes */
	if (o->fill && o->fill->records == 0 && o->drop_unreported == 0)
		return;
	pthread_mutex_lock(&o->mu);
	hand_over(o);
	pthread_mutex_unlock(&o->mu);
}

void tap_out_line(struct tap_out *o, const char *data, size_t len)
{
	struct chunk *c = o->fill;
	o->records++;
	if (!c) { /* no memory for a batch */
		out_note_drop(o, 1, TAP_OUT_LOST_NO_MEMORY);
		tap_out_flush(o);
		return;
	}
	tap_buf_append(&c->data, data, len);
	tap_buf_putc(&c->data, '\n');
	c->records++;
	if (c->data.len >= TAP_OUT_BATCH_BYTES || c->data.oom)
		tap_out_flush(o);
}

void tap_out_block(struct tap_out *o, const void *data, size_t len)
{
	struct chunk *c = o->fill;
	o->records++;
	if (!c) {
		out_note_drop(o, 1, TAP_OUT_LOST_NO_MEMORY);
		tap_out_flush(o);
		return;
	}
	if (c->records == c->ends_cap) {
		size_t cap = c->ends_cap ? c->ends_cap * 2 : 256;
		size_t *ends = realloc(c->ends, cap * sizeof *ends);
		if (!ends) {
			c->data.oom = true; /* the batch is dropped whole at the flush */
		} else {
			c->ends = ends;
			c->ends_cap = cap;
		}
	}
	tap_buf_append(&c->data, data, len);
	if (!c->data.oom)
		c->ends[c->records] = c->data.len;
	c->records++;
	if (c->data.len >= TAP_OUT_BATCH_BYTES || c->data.oom)
		tap_out_flush(o);
}

bool tap_out_text(struct tap_out *o, const char *data, size_t len)
{
	return tap_out_text_until(o, data, len, 0);
}

bool tap_out_text_until(struct tap_out *o, const char *data, size_t len, int64_t deadline_us)
{
	pthread_mutex_lock(&o->mu);
	o->records++;
	uint64_t lines = out_count_newlines(data, len);
	struct chunk *c = out_chunk_with_room(o, len);
	while (!c && !o->reserve && written_until(o, deadline_us)) /* the reserve is out */
		c = out_chunk_with_room(o, len);
	bool taken = c && room_for(o, len);
	while (c && !taken && written_until(o, deadline_us)) /* the backlog is full */
		taken = room_for(o, len);
	if (!taken) {
		out_note_drop(o, lines ? lines : 1, c ? TAP_OUT_LOST_BACKLOG_FULL : TAP_OUT_LOST_NO_MEMORY);
		if (c)
			out_chunk_recycle(o, c);
	} else {
		tap_buf_append(&c->data, data, len);
		c->records = lines;
		(void)queue_drop_note(o);
		enqueue(o, c);
	}
	pthread_mutex_unlock(&o->mu);
	return taken;
}

void tap_out_wait_until(struct tap_out *o, int64_t mono_us)
{
	pthread_mutex_lock(&o->mu);
	o->wait_until_us = mono_us;
	pthread_mutex_unlock(&o->mu);
}

void tap_out_reopen(struct tap_out *o)
{
	if (!o->path)
		return;
	pthread_mutex_lock(&o->mu);
	hand_over(o);
	struct chunk *c = out_chunk_take(o);
	if (c) {
		c->kind = CHUNK_REOPEN;
		enqueue(o, c);
	}
	pthread_mutex_unlock(&o->mu);
	if (!c)
		out_report(TAP_OUT_REPORT_ERROR, "--%s %s: cannot reopen: out of memory", o->name, o->path);
}

void tap_out_get_stats(struct tap_out *o, struct tap_out_stats *st)
{
	pthread_mutex_lock(&o->mu);
	out_stats_locked(o, st);
	pthread_mutex_unlock(&o->mu);
}

/* Under mu: a TEXT output's last line names the lines lost since its last note; with memory short it waits for the
 * reserve to be written, until the deadline. */
static void last_text_note(struct tap_out *o, int64_t deadline_us)
{
	while (!queue_drop_note(o) && written_until(o, deadline_us))
		;
}

/* Writers that could not be cancelled, kept reachable so their memory is not reported as leaked. */
static struct tap_out *abandoned[16];

void tap_out_close(struct tap_out *o, int64_t deadline_us, struct tap_out_stats *st)
{
	struct tap_out_stats last = {0};
	if (!o) {
		if (st)
			*st = last;
		return;
	}
	pthread_mutex_lock(&o->mu);
	if (o->wait_until_us < deadline_us)
		o->wait_until_us = deadline_us;
	if (o->kind != TAP_OUT_TEXT)
		hand_over(o);
	else
		last_text_note(o, deadline_us);
	o->closing = true;
	writer_hurry(o);
	struct timespec until = tap_mono_abs(deadline_us);
	while (!o->writer_done && tap_out_clock_us() < deadline_us)
		pthread_cond_timedwait(&o->room, &o->mu, &until);
	bool done = o->writer_done;
	pthread_mutex_unlock(&o->mu);

	bool joined = done;
	if (done) {
		pthread_join(o->thread, NULL);
	} else {
		pthread_cancel(o->thread);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += CANCEL_JOIN_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		joined = pthread_timedjoin_np(o->thread, NULL, &ts) == 0;
	}
	pthread_mutex_lock(&o->mu);
	o->lost_by[TAP_OUT_LOST_UNFLUSHED] += out_unwritten_records(o, joined ? o->current_off : 0);
	out_stats_locked(o, &last);
	pthread_mutex_unlock(&o->mu);
	if (st)
		*st = last;
	if (!joined) {
		for (size_t i = 0; i < sizeof abandoned / sizeof abandoned[0]; i++) {
			if (!abandoned[i]) {
				abandoned[i] = o;
				break;
			}
		}
		return;
	}
	if (o->own_fd && o->fd >= 0)
		close(o->fd);
	out_free(o);
}
