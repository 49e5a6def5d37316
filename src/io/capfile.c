/* The file source of the capture reader: stdio over a regular file (1 MiB buffered), or unbuffered over a pipe, a
 * FIFO or a device, where a read may wait and a signal may interrupt it; the core parses what it reads. */
#include "amqptap/capfile.h"

#include "amqptap/status.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct capfile {
	FILE *f;
	bool stream; /* a pipe or device: unbuffered, and the reader hears when a read may wait */
};

static size_t capfile_read(void *src, void *buf, size_t n, const struct tap_capture_waiter *w)
{
	struct capfile *cf = src;
	size_t got = fread(buf, 1, n, cf->f);
	/* a signal interrupted a read that waited: go on unless it asked to stop */
	while (got < n && ferror(cf->f) && errno == EINTR && !w->stop(w->ctx)) {
		clearerr(cf->f);
		got += fread((uint8_t *)buf + got, 1, n - got, cf->f);
	}
	return got;
}

/* While no byte is waiting, the reader hears so at once and every TAP_CAPFILE_IDLE_EVERY_MS (it writes what it
 * batched; a live capture's clock goes on), until one is or it says to stop. */
static void capfile_wait(void *src, const struct tap_capture_waiter *w)
{
	struct capfile *cf = src;
	if (!cf->stream)
		return;
	struct pollfd p = {.fd = fileno(cf->f), .events = POLLIN};
	for (int wait_ms = 0;; wait_ms = TAP_CAPFILE_IDLE_EVERY_MS) {
		int n = poll(&p, 1, wait_ms);
		if (n > 0 || (n < 0 && errno != EINTR) || w->stop(w->ctx))
			return; /* readable, or the read says what is wrong, or no read at all */
		if (n == 0)
			w->idle(w->ctx);
	}
}

static enum tap_capture_src_state capfile_state(void *src)
{
	struct capfile *cf = src;
	if (ferror(cf->f))
		return TAP_CAPTURE_SRC_ERROR;
	return feof(cf->f) ? TAP_CAPTURE_SRC_END : TAP_CAPTURE_SRC_OK;
}

static void capfile_close(void *src)
{
	struct capfile *cf = src;
	fclose(cf->f);
	free(cf);
}

static const struct tap_capture_src_ops capfile_ops = {
	.read = capfile_read, .wait = capfile_wait, .state = capfile_state, .close = capfile_close,
};

static int capfile_fail(char *err, size_t cap, const char *path, int errnum)
{
	if (err && cap)
		snprintf(err, cap, "%s: %s", path, strerror(errnum));
	return TAP_E_IO;
}

static int no_memory(char *err, size_t cap)
{
	if (err && cap)
		snprintf(err, cap, "out of memory");
	return TAP_E_NOMEM;
}

static bool stop_asked(bool (*stop)(void *ctx), void *ctx)
{
	return stop && stop(ctx);
}

/* Standard input, on a descriptor of its own (fclose must not close fd 0). NULL with errno set. */
static FILE *open_stdin(void)
{
	int fd = dup(STDIN_FILENO);
	FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
	if (!f && fd >= 0) {
		int e = errno;
		(void)close(fd); /* fdopen failed: the descriptor is ours to close */
		errno = e;
	}
	return f;
}

/* A FIFO's open waits for a writer; a signal interrupts it (one just before the open is seen here too, one in
 * between waits for the writer or the next signal). */
static FILE *open_named(const char *path, bool (*stop)(void *ctx), void *ctx)
{
	FILE *f = NULL;
	while (!stop_asked(stop, ctx) && !(f = fopen(path, "rb")) && errno == EINTR)
		;
	return f;
}

int tap_capfile_open_until(struct tap_capture **out, const char *path, bool (*stop)(void *ctx), void *ctx, char *err,
			   size_t cap)
{
	*out = NULL;
	bool is_stdin = strcmp(path, "-") == 0;
	FILE *f = is_stdin ? open_stdin() : open_named(path, stop, ctx);
	if (!f && !is_stdin && stop_asked(stop, ctx))
		return tap_capture_new_stopped(out, path) < 0 ? no_memory(err, cap) : TAP_OK;
	if (!f)
		return capfile_fail(err, cap, path, errno);
	struct stat st;
	bool known = fstat(fileno(f), &st) == 0;
	if (known && S_ISDIR(st.st_mode)) { /* fopen opens a directory for reading */
		fclose(f);
		return capfile_fail(err, cap, path, EISDIR);
	}
	struct capfile *cf = malloc(sizeof *cf);
	if (!cf) {
		fclose(f);
		return no_memory(err, cap);
	}
	*cf = (struct capfile){.f = f, .stream = known && !S_ISREG(st.st_mode)};
	if (cf->stream) /* stdio would wait to fill its buffer before handing over a packet */
		setvbuf(f, NULL, _IONBF, 0);
	else
		setvbuf(f, NULL, _IOFBF, 1 << 20);
	return tap_capture_open_src(out, &capfile_ops, cf, path, stop, ctx, err, cap);
}

int tap_capfile_open(struct tap_capture **out, const char *path, char *err, size_t cap)
{
	return tap_capfile_open_until(out, path, NULL, NULL, err, cap);
}
