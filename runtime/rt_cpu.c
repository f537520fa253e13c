/* rt_cpu.c - the x86-64 level a CPU trainer is compiled for (netc --cpu), and its check.
 *
 * The build makes the runtime once per level: libnetrt.a for x86-64 (every 64-bit x86 CPU),
 * libnetrt-x86-64-v3.a (AVX2, FMA) and libnetrt-x86-64-v4.a (AVX-512), RT_CPU_LEVEL naming the
 * level of each; netc compiles the trainer's C for the same level and links the matching one.
 * On a CPU without the level's instructions such a trainer would die of SIGILL in its first
 * loop; rt_cpu_check stops it first, before main, with the features it lacks. That constructor
 * is compiled for plain x86-64 whatever the file's level, so that it runs anywhere.
 *
 * The level changes speed, never a value: the trainer and the runtime are compiled with
 * -ffp-contract=off (no multiply-add is fused at one level and not at another), and a sum that
 * vector lanes share adds them in a fixed order (rt_internal.h: RT_LANES), so a trainer computes the
 * same bits at every level (test cpu_levels). netc reads the machine's level here too.
 */
#include <stdio.h>
#include <stdlib.h>

#include "netrt.h"

#ifndef RT_CPU_LEVEL
#define RT_CPU_LEVEL 1
#endif

const int rt_cpu_level = RT_CPU_LEVEL;

const char *rt_cpu_level_name(int level) {
    return level >= 4 ? "x86-64-v4" : level == 3 ? "x86-64-v3" : "x86-64";
}

/* __builtin_cpu_supports takes only literals, so each feature is a line. v3 and v4 require
 * more than these (MOVBE, LZCNT, F16C), but no CPU has AVX2, FMA and BMI2 without them; these
 * are the names GCC and Clang both know. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RT_NEED(lv, feat)                                                                                              \
    if (level >= (lv) && !__builtin_cpu_supports(feat)) n += snprintf(buf + n, n < size ? size - n : 0, " " feat)
#define RT_CPU_TARGET __attribute__((target("arch=x86-64")))
#else
#define RT_CPU_TARGET
#endif

RT_CPU_TARGET int rt_cpu_missing(int level, char *buf, size_t size) {
    size_t n = 0;
    if (size) buf[0] = 0;
#ifdef RT_NEED
    __builtin_cpu_init(); /* may run before libgcc's own constructor has */
    RT_NEED(3, "avx");
    RT_NEED(3, "avx2");
    RT_NEED(3, "fma");
    RT_NEED(3, "bmi");
    RT_NEED(3, "bmi2");
    RT_NEED(4, "avx512f");
    RT_NEED(4, "avx512bw");
    RT_NEED(4, "avx512cd");
    RT_NEED(4, "avx512dq");
    RT_NEED(4, "avx512vl");
#else
    if (level > 1) n += snprintf(buf, size, " (not an x86-64 CPU)");
#endif
    return n > 0;
}

RT_CPU_TARGET int rt_cpu_host_level(void) {
    char buf[128];
    return !rt_cpu_missing(4, buf, sizeof buf) ? 4 : !rt_cpu_missing(3, buf, sizeof buf) ? 3 : 1;
}

#if RT_CPU_LEVEL > 1
__attribute__((constructor)) RT_CPU_TARGET static void rt_cpu_check(void) {
    char missing[256];
    if (!rt_cpu_missing(RT_CPU_LEVEL, missing, sizeof missing)) return;
    fprintf(stderr,
            "error: this trainer was compiled for %s CPUs, and this CPU lacks%s\n"
            "  hint: compile it again with netc --cpu %s (or --cpu x86-64, which every 64-bit x86 CPU runs)\n",
            rt_cpu_level_name(RT_CPU_LEVEL), missing, rt_cpu_level_name(rt_cpu_host_level()));
    exit(5); /* as a GPU trainer without its device: this machine cannot run it */
}
#endif
