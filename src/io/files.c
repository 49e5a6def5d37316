/* The file system looks the core leaves to its caller (conf.c's check that no two outputs are one file). */
#include "amqptap/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool tap_files_same_inode(const char *a, const char *b)
{
	struct stat sa, sb;
	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int tap_files_read(const char *path, size_t max, char **out, size_t *len, char *err, size_t err_cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, err_cap, "%s: %s", path, strerror(errno));
		return -1;
	}
	size_t cap = 65536, n = 0;
	char *buf = malloc(cap + 1);
	for (;;) {
		if (!buf) {
			snprintf(err, err_cap, "%s: out of memory", path);
			break;
		}
		if (n == cap) {
			if (cap > max) {
				snprintf(err, err_cap, "%s: larger than %zu bytes", path, max);
				break;
			}
			char *nb = realloc(buf, 2 * cap + 1);
			if (!nb) {
				snprintf(err, err_cap, "%s: out of memory", path);
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			snprintf(err, err_cap, "%s: %s", path, strerror(errno));
			break;
		}
		if (r == 0) {
			if (n > max) {
				snprintf(err, err_cap, "%s: larger than %zu bytes", path, max);
				break;
			}
			close(fd);
			buf[n] = '\0';
			*out = buf;
			*len = n;
			return 0;
		}
		n += (size_t)r;
	}
	free(buf);
	close(fd);
	return -1;
}
