/* The process as /proc/self shows it, for the metrics endpoint's process_* series. */
#include "procself.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* Fields 14 (utime), 15 (stime), 22 (starttime), 23 (vsize), 24 (rss) of /proc/self/stat; false if unreadable. */
static bool read_self_stat(unsigned long long *ticks, unsigned long long *start, unsigned long long *vsize,
                           long long *rss_pages)
{
	char buf[1024];
	FILE *f = fopen("/proc/self/stat", "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	(void)fclose(f); /* read-only */
	buf[n] = '\0';
	const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
	if (!p)
		return false;
	unsigned long long utime, stime;
	int got = sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu %llu %lld",
	                 &utime, &stime, start, vsize, rss_pages);
	if (got != 5)
		return false;
	*ticks = utime + stime;
	return true;
}

/* When the process started, in Unix seconds: now, less its age (the clock since boot, less its start tick). Not
 * /proc/stat's boot time: the service's ProcSubset=pid hides that file. */
double tap_procself_start_time(void)
{
	unsigned long long ticks, start, vsize;
	long long rss;
	struct timespec now, since_boot;
	long hz = sysconf(_SC_CLK_TCK);
	if (!read_self_stat(&ticks, &start, &vsize, &rss) || hz <= 0 || clock_gettime(CLOCK_REALTIME, &now) != 0 ||
	    clock_gettime(CLOCK_BOOTTIME, &since_boot) != 0)
		return 0;
	double age = (double)since_boot.tv_sec + (double)since_boot.tv_nsec / 1e9 - (double)start / (double)hz;
	return (double)now.tv_sec + (double)now.tv_nsec / 1e9 - age;
}

static uint64_t count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	uint64_t n = 0;
	for (struct dirent *e = readdir(d); e; e = readdir(d))
		if (e->d_name[0] != '.')
			n++;
	(void)closedir(d); /* read-only */
	return n > 0 ? n - 1 : 0; /* not the descriptor of the listing itself */
}

void tap_procself_snapshot(struct tap_metrics_snapshot *s, double start_time_seconds)
{
	unsigned long long ticks, start, vsize;
	long long rss;
	long hz = sysconf(_SC_CLK_TCK);
	long page = sysconf(_SC_PAGESIZE);
	if (!read_self_stat(&ticks, &start, &vsize, &rss) || hz <= 0 || page <= 0)
		return;
	s->have_process = true;
	s->cpu_seconds = (double)ticks / (double)hz;
	s->vsize_bytes = vsize;
	s->rss_bytes = rss > 0 ? (uint64_t)rss * (uint64_t)page : 0;
	s->start_time_seconds = start_time_seconds;
	s->open_fds = count_open_fds();
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		s->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}
