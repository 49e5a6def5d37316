/* The capture file source (src/io/capfile.c) under the core's reader: a file, standard input and a pipe give the
 * reader exactly what the same bytes in memory give it; a pipe that waits tells the reader so (idle); a path that
 * cannot be read is TAP_E_IO; a stop before the file is opened is a capture without packets. */
#include "amqptap/capfile.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include "tap_file.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Every callback folded into one hash, in order, with what it carried. */
struct seen {
	uint64_t hash, events, idles;
};

static void mix(struct seen *s, const void *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		s->hash = (s->hash ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
	s->events++;
}

static void s_packet(void *ctx, int64_t ts)
{
	mix(ctx, &ts, sizeof ts);
}

static void *s_open(void *ctx, uint64_t stream, const char *client, const char *server, bool midstream, int64_t ts)
{
	mix(ctx, client, strlen(client));
	mix(ctx, server, strlen(server));
	mix(ctx, &midstream, sizeof midstream);
	mix(ctx, &ts, sizeof ts);
	return (void *)(uintptr_t)stream;
}

static void s_data(void *ctx, void *user, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts)
{
	uintptr_t id = (uintptr_t)user;
	mix(ctx, &id, sizeof id);
	mix(ctx, &dir, sizeof dir);
	mix(ctx, data, len);
	mix(ctx, &ts, sizeof ts);
}

static void s_close(void *ctx, void *user, enum tap_capture_end how, int64_t ts)
{
	uintptr_t id = (uintptr_t)user;
	mix(ctx, &id, sizeof id);
	mix(ctx, &how, sizeof how);
	mix(ctx, &ts, sizeof ts);
}

static void s_idle(void *ctx)
{
	((struct seen *)ctx)->idles++;
}

static const char *loopback_path(void)
{
	static char path[512];
	snprintf(path, sizeof path, "%s/tests/data/capture/loopback-amqp.pcapng", TAP_SOURCE_DIR);
	return path;
}

/* Runs c (freed here) for port 5699 and returns what the reader saw, with its stats. */
static struct seen run(struct tap_capture *c, struct tap_capture_stats *st)
{
	struct seen s = {.hash = 0xcbf29ce484222325ull};
	struct tap_capture_cb cb = {.ctx = &s, .packet = s_packet, .open = s_open, .data = s_data, .close = s_close,
				    .idle = s_idle};
	char err[256] = "";
	ck_assert_msg(tap_capture_run(c, 5699, &cb, err, sizeof err) == TAP_OK, "%s", err);
	tap_capture_get_stats(c, st);
	tap_capture_free(c);
	return s;
}

/* What the loopback capture gives from memory: what every file source must give too. */
static struct seen from_memory(struct tap_capture_stats *st)
{
	struct tap_buf file;
	tap_file_slurp(loopback_path(), &file);
	struct tap_capture *c;
	char err[256] = "";
	ck_assert_msg(tap_capture_open_mem(&c, file.data, file.len, "mem", err, sizeof err) == TAP_OK, "%s", err);
	struct seen s = run(c, st);
	tap_buf_deinit(&file);
	ck_assert_uint_gt(st->packets, 0);
	ck_assert_uint_gt(st->bytes, 0);
	return s;
}

static void same_as_memory(const struct seen *s, const struct tap_capture_stats *st)
{
	struct tap_capture_stats want;
	struct seen m = from_memory(&want);
	ck_assert_uint_eq(s->events, m.events);
	ck_assert_uint_eq(s->hash, m.hash);
	ck_assert_uint_eq(st->packets, want.packets);
	ck_assert_uint_eq(st->streams, want.streams);
	ck_assert_uint_eq(st->bytes, want.bytes);
	ck_assert_uint_eq(st->file_bytes, want.file_bytes);
}

START_TEST(a_file_reads_as_memory_does)
{
	struct tap_capture *c;
	char err[256] = "";
	ck_assert_msg(tap_capfile_open(&c, loopback_path(), err, sizeof err) == TAP_OK, "%s", err);
	struct tap_capture_stats st;
	struct seen s = run(c, &st);
	same_as_memory(&s, &st);
	ck_assert_uint_eq(s.idles, 0); /* a regular file never waits */
}
END_TEST

START_TEST(standard_input_reads_as_memory_does)
{
	int saved = dup(STDIN_FILENO);
	int fd = open(loopback_path(), O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(dup2(fd, STDIN_FILENO), STDIN_FILENO);
	close(fd);
	struct tap_capture *c;
	char err[256] = "";
	ck_assert_msg(tap_capfile_open(&c, "-", err, sizeof err) == TAP_OK, "%s", err);
	struct tap_capture_stats st;
	struct seen s = run(c, &st);
	ck_assert_int_eq(dup2(saved, STDIN_FILENO), STDIN_FILENO); /* the capture had a descriptor of its own */
	close(saved);
	same_as_memory(&s, &st);
}
END_TEST

/* The offset of the pcapng block boundary nearest past the middle of the file (the reader waits between records,
 * not inside one). */
static size_t block_boundary(const struct tap_buf *file)
{
	size_t at = 0;
	while (at + 8 <= file->len && at < file->len / 2) {
		uint32_t total;
		memcpy(&total, file->data + at + 4, 4); /* written little-endian, as this host reads it */
		ck_assert_uint_ge(total, 12);
		at += total;
	}
	ck_assert_uint_lt(at, file->len);
	return at;
}

/* A writer that hands the capture over in two parts, a pause between them: the reader hears that it waits, and
 * still sees every byte as from memory. */
START_TEST(a_pipe_that_waits_says_so_and_reads_as_memory_does)
{
	struct tap_buf file;
	tap_file_slurp(loopback_path(), &file);
	size_t half = block_boundary(&file);
	int p[2];
	ck_assert_int_eq(pipe(p), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(p[0]);
		ssize_t w = write(p[1], file.data, half);
		usleep(300 * 1000);
		for (size_t at = half; w >= 0 && at < file.len; at += (size_t)w)
			w = write(p[1], file.data + at, file.len - at);
		_exit(w < 0);
	}
	close(p[1]);
	char path[64], err[256] = "";
	snprintf(path, sizeof path, "/dev/fd/%d", p[0]);
	struct tap_capture *c;
	ck_assert_msg(tap_capfile_open(&c, path, err, sizeof err) == TAP_OK, "%s", err);
	struct tap_capture_stats st;
	struct seen s = run(c, &st);
	close(p[0]);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	tap_buf_deinit(&file);
	same_as_memory(&s, &st);
	ck_assert_uint_ge(s.idles, 2); /* at once, and again while the writer paused */
}
END_TEST

START_TEST(paths_that_cannot_be_read_are_io_errors)
{
	struct tap_capture *c = (struct tap_capture *)&c;
	char err[256] = "";
	ck_assert_int_eq(tap_capfile_open(&c, "/nonexistent/file.pcap", err, sizeof err), TAP_E_IO);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(err, "/nonexistent/file.pcap: No such file"), "%s", err);
	ck_assert_int_eq(tap_capfile_open(&c, "/", err, sizeof err), TAP_E_IO);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(err, "/: Is a directory"), "%s", err);
}
END_TEST

static bool stop_now(void *ctx)
{
	(*(int *)ctx)++;
	return true;
}

/* A FIFO without a writer would wait in open(): a stop asked before is a capture without packets, no error. */
START_TEST(a_stop_before_the_open_is_a_capture_without_packets)
{
	char dir[] = "/tmp/tap-capfile-XXXXXX", path[64];
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/fifo", dir);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	int asked = 0;
	struct tap_capture *c;
	char err[256] = "";
	ck_assert_msg(tap_capfile_open_until(&c, path, stop_now, &asked, err, sizeof err) == TAP_OK, "%s", err);
	ck_assert_int_gt(asked, 0);
	struct tap_capture_stats st;
	struct seen s = run(c, &st);
	ck_assert_uint_eq(s.events, 0);
	ck_assert_uint_eq(st.packets, 0);
	unlink(path);
	rmdir(dir);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("capfile");
	TCase *tc = tcase_create("sources");
	tcase_add_test(tc, a_file_reads_as_memory_does);
	tcase_add_test(tc, standard_input_reads_as_memory_does);
	tcase_add_test(tc, a_pipe_that_waits_says_so_and_reads_as_memory_does);
	tcase_add_test(tc, paths_that_cannot_be_read_are_io_errors);
	tcase_add_test(tc, a_stop_before_the_open_is_a_capture_without_packets);
	suite_add_tcase(s, tc);
	return tap_check_failures(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
