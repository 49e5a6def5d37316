/* tap_gendoc: writes the amqptap(1) man page or the bash completion from the option table at build time, so
 * neither can drift from what the parser takes. Not installed.
 *   tap_gendoc man VERSION OUT | tap_gendoc bash OUT */
#include "amqptap/conf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	bool man = argc == 4 && strcmp(argv[1], "man") == 0;
	bool bash = argc == 3 && strcmp(argv[1], "bash") == 0;
	if (!man && !bash) {
		fprintf(stderr, "usage: tap_gendoc man VERSION OUT | tap_gendoc bash OUT\n");
		return 2;
	}
	const char *path = argv[argc - 1];
	size_t len = man ? tap_conf_man(NULL, 0, argv[2]) : tap_conf_bash_completion(NULL, 0);
	char *text = malloc(len + 1);
	if (!text) {
		fprintf(stderr, "tap_gendoc: out of memory\n");
		return 1;
	}
	if (man)
		tap_conf_man(text, len + 1, argv[2]);
	else
		tap_conf_bash_completion(text, len + 1);
	FILE *f = fopen(path, "w");
	if (!f || fwrite(text, 1, len, f) != len || fclose(f) != 0) {
		fprintf(stderr, "tap_gendoc: %s: cannot write\n", path);
		free(text);
		return 1;
	}
	free(text);
	return 0;
}
