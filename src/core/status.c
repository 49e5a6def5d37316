/* tap_strerror(): one string per status code of status.h. */
#include "amqptap/status.h"

#include <stddef.h>

struct status_entry {
	int code;
	const char *name;
	const char *text;
};

static const struct status_entry status_table[] = {
#define TAP_STATUS_ROW(name, value, text) {value, #name, text},
	TAP_STATUS_LIST(TAP_STATUS_ROW)
#undef TAP_STATUS_ROW
};

static const struct status_entry *status_find(int status)
{
	for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
		if (status_table[i].code == status)
			return &status_table[i];
	return NULL;
}

const char *tap_strerror(int status)
{
	const struct status_entry *e = status_find(status);
	return e ? e->text : "unknown status";
}

const char *tap_status_name(int status)
{
	const struct status_entry *e = status_find(status);
	return e ? e->name : NULL;
}
