// Reads typed values off a libFuzzer input, front to back; past its end
// every read is 0, so a target always runs to completion on short inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

class FuzzInput {
public:
    FuzzInput(const uint8_t *data, size_t size) : p_(data), n_(size) {}
    bool empty() const { return n_ == 0; }
    template <class T>
    T take() {
        T v{};
        const size_t k = n_ < sizeof v ? n_ : sizeof v;
        std::memcpy(&v, p_, k);
        p_ += k;
        n_ -= k;
        return v;
    }
    uint32_t below(uint32_t n) { return n ? take<uint32_t>() % n : 0; }
    // A float that is usually ordinary and sometimes NaN, inf, huge or negative zero.
    float value() {
        switch (take<uint8_t>() % 16) {
            case 0: return __builtin_nanf("");
            case 1: return __builtin_inff();
            case 2: return -__builtin_inff();
            case 3: return 1e30f;
            case 4: return -0.0f;
            default: return float(int(take<uint8_t>()) - 128) / 32.0f;
        }
    }
    // Up to max bytes as a string (may be empty; never holds a NUL).
    std::string text(size_t max) {
        std::string s;
        const size_t len = below(uint32_t(max + 1));
        for (size_t i = 0; i < len; ++i) {
            const char c = char(take<uint8_t>() | 1);
            s.push_back(c);
        }
        return s;
    }

private:
    const uint8_t *p_;
    size_t n_;
};

// A failed call must leave a sentence behind.
#define FUZZ_CHECK(cond)                                                           \
    do {                                                                           \
        if (!(cond)) {                                                             \
            __builtin_printf("fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
            __builtin_trap();                                                      \
        }                                                                          \
    } while (0)
