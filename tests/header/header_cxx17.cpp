// Compiled with -std=c++17 -Wall -Wextra -Werror -pedantic: the header must be clean C++17.
#include "intentkv.h"
int ikv_header_cxx17_probe() { return IKV_VERSION_NUMBER > 0 && sizeof(ikv_pool_config) > 0; }
