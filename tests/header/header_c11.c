/* Compiled with -std=c11 -Wall -Wextra -Werror -pedantic: the header must be clean C11. */
#include "intentkv.h"
int ikv_header_c11_probe(void) { return IKV_VERSION_NUMBER > 0 && sizeof(ikv_pool_config) > 0; }
