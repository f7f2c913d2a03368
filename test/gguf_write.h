// gguf_write.h — a tiny GGUF writer for the tests and the model generator (test/ only).
// A growable byte buffer and the little-endian puts that GGUF is made of; see qwen.cu section 2
// for the format.
#pragma once

typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;

static void put(Buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = (uint8_t *)realloc(b->p, b->cap);
        if (!b->p) die("out of host memory");
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(Buf *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(Buf *b, int32_t v) { put(b, &v, 4); }
static void put_u64(Buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(Buf *b, float v) { put(b, &v, 4); }
static void put_strn(Buf *b, const char *s, size_t n) { put_u64(b, n); put(b, s, n); }
static void put_str(Buf *b, const char *s) { put_strn(b, s, strlen(s)); }
static void put_pad(Buf *b, size_t align) {
    while (b->n % align) {
        uint8_t z = 0;
        put(b, &z, 1);
    }
}

// key/value pairs
static void kv_u32(Buf *b, const char *key, uint32_t v) { put_str(b, key); put_i32(b, GGUF_TYPE_U32); put_u32(b, v); }
static void kv_f32(Buf *b, const char *key, float v) { put_str(b, key); put_i32(b, GGUF_TYPE_F32); put_f32(b, v); }
static void kv_str(Buf *b, const char *key, const char *v) { put_str(b, key); put_i32(b, GGUF_TYPE_STRING); put_str(b, v); }
static void kv_bool(Buf *b, const char *key, int v) {
    uint8_t x = (uint8_t)(v != 0);
    put_str(b, key);
    put_i32(b, GGUF_TYPE_BOOL);
    put(b, &x, 1);
}
static void kv_arr_i32(Buf *b, const char *key, const int32_t *v, uint64_t n) {
    put_str(b, key);
    put_i32(b, GGUF_TYPE_ARRAY);
    put_i32(b, GGUF_TYPE_I32);
    put_u64(b, n);
    put(b, v, n * 4);
}
// tensor info: name, dims, type, offset in the data blob
static void put_tensor_info(Buf *b, const char *name, int n_dims, const int64_t *ne, int type, uint64_t offset) {
    put_str(b, name);
    put_u32(b, (uint32_t)n_dims);
    for (int d = 0; d < n_dims; d++) put_u64(b, (uint64_t)ne[d]);
    put_i32(b, type);
    put_u64(b, offset);
}
