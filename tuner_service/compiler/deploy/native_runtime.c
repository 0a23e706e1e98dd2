/* The native runtime linked into every libmodel.so: walks a model's program of kernel calls.
 *
 * A program is an array of records {function, kind, argc, aux, args}: a CALL record calls
 * `function(args[0], ..., args[argc-1], (int64_t)aux)` (the kernels' calling convention, aux is
 * the thread count); a COPY record copies aux bytes from args[0] to args[1] (the staging copy of
 * a kernel that over-reads its input). Python builds the records with absolute pointers and
 * runs a whole segment in one call (tuner_program_run). A C program instead opens the files
 * `tuner build --standalone` writes (model.program, model.weights) with tuner_model_open: the
 * program there names kernels by symbol and buffers by (region, byte offset), and loading
 * resolves them once. See docs/native.md for the file formats.
 *
 * Every read of those files is bounds-checked: a truncated or corrupted file is an error code,
 * never a crash. Nothing here is global: each handle owns its arena, scratch and weights, so
 * handles are independent (one run at a time per handle).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TUNER_MAX_ARGS 64
#define TUNER_PROGRAM_VERSION 1

enum tuner_error {
    TUNER_OK = 0,
    TUNER_E_IO = 1,        /* a file is missing or unreadable */
    TUNER_E_FORMAT = 2,    /* a file is truncated or malformed */
    TUNER_E_MISMATCH = 3,  /* the weights file is not the one the program was written with */
    TUNER_E_SYMBOL = 4,    /* the library lacks a kernel the program calls */
    TUNER_E_NOMEM = 5,
    TUNER_E_ARGS = 6,      /* a record has more arguments than this runtime dispatches */
    TUNER_E_INVALID = 7,   /* a null handle, input or output pointer */
};

enum { KIND_CALL = 0, KIND_COPY = 1 };
enum { REGION_WEIGHTS = 0, REGION_ARENA = 1, REGION_SCRATCH = 2, REGION_COUNT = 3 };

typedef struct {
    void *function;
    int64_t kind;
    int64_t argc;
    int64_t aux;
    void **args;
} tuner_record;

typedef struct {
    char *name;
    int64_t elements;
    int64_t offset; /* bytes into the arena */
} tuner_tensor;

typedef struct tuner_model {
    void *self;            /* dlopen handle of this library (for the kernels' symbols) */
    void *regions[REGION_COUNT];
    int64_t region_bytes[REGION_COUNT];
    int64_t nthreads;
    int64_t ninputs, noutputs, nrecords;
    tuner_tensor *inputs, *outputs;
    tuner_record *records;
    void **arg_storage;
} tuner_model;

const char *tuner_strerror(int code) {
    switch (code) {
    case TUNER_OK: return "ok";
    case TUNER_E_IO: return "cannot read the program or weights file";
    case TUNER_E_FORMAT: return "the program or weights file is truncated or malformed";
    case TUNER_E_MISMATCH: return "the weights file does not belong to this program";
    case TUNER_E_SYMBOL: return "the library has no kernel the program calls";
    case TUNER_E_NOMEM: return "out of memory";
    case TUNER_E_ARGS: return "a kernel takes more arguments than the runtime dispatches";
    case TUNER_E_INVALID: return "a null handle, input or output";
    default: return "unknown error";
    }
}

int64_t tuner_max_args(void) { return TUNER_MAX_ARGS; }

/* Pointer lists for the dispatch below: P<n> is n `void *` parameters, A<n> the first n args. */
#define P1 void *
#define P2 P1, void *
#define P3 P2, void *
#define P4 P3, void *
#define P5 P4, void *
#define P6 P5, void *
#define P7 P6, void *
#define P8 P7, void *
#define P9 P8, void *
#define P10 P9, void *
#define P11 P10, void *
#define P12 P11, void *
#define P13 P12, void *
#define P14 P13, void *
#define P15 P14, void *
#define P16 P15, void *
#define P17 P16, void *
#define P18 P17, void *
#define P19 P18, void *
#define P20 P19, void *
#define P21 P20, void *
#define P22 P21, void *
#define P23 P22, void *
#define P24 P23, void *
#define P25 P24, void *
#define P26 P25, void *
#define P27 P26, void *
#define P28 P27, void *
#define P29 P28, void *
#define P30 P29, void *
#define P31 P30, void *
#define P32 P31, void *
#define P33 P32, void *
#define P34 P33, void *
#define P35 P34, void *
#define P36 P35, void *
#define P37 P36, void *
#define P38 P37, void *
#define P39 P38, void *
#define P40 P39, void *
#define P41 P40, void *
#define P42 P41, void *
#define P43 P42, void *
#define P44 P43, void *
#define P45 P44, void *
#define P46 P45, void *
#define P47 P46, void *
#define P48 P47, void *
#define P49 P48, void *
#define P50 P49, void *
#define P51 P50, void *
#define P52 P51, void *
#define P53 P52, void *
#define P54 P53, void *
#define P55 P54, void *
#define P56 P55, void *
#define P57 P56, void *
#define P58 P57, void *
#define P59 P58, void *
#define P60 P59, void *
#define P61 P60, void *
#define P62 P61, void *
#define P63 P62, void *
#define P64 P63, void *
#define A1 a[0]
#define A2 A1, a[1]
#define A3 A2, a[2]
#define A4 A3, a[3]
#define A5 A4, a[4]
#define A6 A5, a[5]
#define A7 A6, a[6]
#define A8 A7, a[7]
#define A9 A8, a[8]
#define A10 A9, a[9]
#define A11 A10, a[10]
#define A12 A11, a[11]
#define A13 A12, a[12]
#define A14 A13, a[13]
#define A15 A14, a[14]
#define A16 A15, a[15]
#define A17 A16, a[16]
#define A18 A17, a[17]
#define A19 A18, a[18]
#define A20 A19, a[19]
#define A21 A20, a[20]
#define A22 A21, a[21]
#define A23 A22, a[22]
#define A24 A23, a[23]
#define A25 A24, a[24]
#define A26 A25, a[25]
#define A27 A26, a[26]
#define A28 A27, a[27]
#define A29 A28, a[28]
#define A30 A29, a[29]
#define A31 A30, a[30]
#define A32 A31, a[31]
#define A33 A32, a[32]
#define A34 A33, a[33]
#define A35 A34, a[34]
#define A36 A35, a[35]
#define A37 A36, a[36]
#define A38 A37, a[37]
#define A39 A38, a[38]
#define A40 A39, a[39]
#define A41 A40, a[40]
#define A42 A41, a[41]
#define A43 A42, a[42]
#define A44 A43, a[43]
#define A45 A44, a[44]
#define A46 A45, a[45]
#define A47 A46, a[46]
#define A48 A47, a[47]
#define A49 A48, a[48]
#define A50 A49, a[49]
#define A51 A50, a[50]
#define A52 A51, a[51]
#define A53 A52, a[52]
#define A54 A53, a[53]
#define A55 A54, a[54]
#define A56 A55, a[55]
#define A57 A56, a[56]
#define A58 A57, a[57]
#define A59 A58, a[58]
#define A60 A59, a[59]
#define A61 A60, a[60]
#define A62 A61, a[61]
#define A63 A62, a[62]
#define A64 A63, a[63]
#define CALL(n) case n: ((void (*)(P##n, int64_t))f)(A##n, t); return TUNER_OK;

static int call_kernel(void *f, int64_t argc, void **a, int64_t t) {
    switch (argc) {
    CALL(1) CALL(2) CALL(3) CALL(4) CALL(5) CALL(6) CALL(7) CALL(8) CALL(9) CALL(10) CALL(11)
    CALL(12) CALL(13) CALL(14) CALL(15) CALL(16) CALL(17) CALL(18) CALL(19) CALL(20) CALL(21)
    CALL(22) CALL(23) CALL(24) CALL(25) CALL(26) CALL(27) CALL(28) CALL(29) CALL(30) CALL(31)
    CALL(32) CALL(33) CALL(34) CALL(35) CALL(36) CALL(37) CALL(38) CALL(39) CALL(40) CALL(41)
    CALL(42) CALL(43) CALL(44) CALL(45) CALL(46) CALL(47) CALL(48) CALL(49) CALL(50) CALL(51)
    CALL(52) CALL(53) CALL(54) CALL(55) CALL(56) CALL(57) CALL(58) CALL(59) CALL(60) CALL(61)
    CALL(62) CALL(63) CALL(64)
    default: return TUNER_E_ARGS;
    }
}

int tuner_program_run(const tuner_record *records, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        const tuner_record *r = &records[i];
        if (r->kind == KIND_COPY) {
            memcpy(r->args[1], r->args[0], (size_t)r->aux);
            continue;
        }
        int status = call_kernel(r->function, r->argc, r->args, r->aux);
        if (status != TUNER_OK) return status;
    }
    return TUNER_OK;
}

/* ---- loading model.program / model.weights ---- */

typedef struct {
    const unsigned char *data;
    size_t size, at;
    int failed;
} reader;

static int64_t read_i64(reader *r) {
    int64_t value = 0;
    if (r->failed || r->size - r->at < sizeof value) {
        r->failed = 1;
        return 0;
    }
    memcpy(&value, r->data + r->at, sizeof value);
    r->at += sizeof value;
    return value;
}

/* A count or size that must lie in [0, limit]; anything else marks the reader failed. */
static int64_t read_count(reader *r, int64_t limit) {
    int64_t value = read_i64(r);
    if (value < 0 || value > limit) r->failed = 1;
    return r->failed ? 0 : value;
}

static char *read_name(reader *r) {
    int64_t length = read_count(r, 4096);
    if (r->failed || r->size - r->at < (size_t)length) {
        r->failed = 1;
        return NULL;
    }
    char *name = malloc((size_t)length + 1);
    if (name == NULL) {
        r->failed = 1;
        return NULL;
    }
    memcpy(name, r->data + r->at, (size_t)length);
    name[length] = '\0';
    r->at += (size_t)length;
    return name;
}

static int read_file(const char *dir, const char *file, unsigned char **data, size_t *size) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path) return TUNER_E_IO;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return TUNER_E_IO;
    int status = TUNER_E_IO;
    long length;
    if (fseek(f, 0, SEEK_END) == 0 && (length = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        *data = malloc((size_t)length + 1);
        *size = (size_t)length;
        if (*data == NULL) status = TUNER_E_NOMEM;
        else if (fread(*data, 1, (size_t)length, f) == (size_t)length) status = TUNER_OK;
    }
    fclose(f);
    return status;
}

/* The files' checksum (native_export.checksum): the data zero-padded to 8-byte little-endian
 * words w, sum of w[i] * (2i + 1) modulo 2^64, xor the length. */
static uint64_t checksum(const unsigned char *data, size_t size) {
    uint64_t total = 0;
    for (size_t i = 0; i * 8 < size; i++) {
        uint64_t word = 0;
        memcpy(&word, data + i * 8, size - i * 8 < 8 ? size - i * 8 : 8);
        total += word * (2 * (uint64_t)i + 1);
    }
    return total ^ (uint64_t)size;
}

static void *zeroed(int64_t bytes) {
    size_t rounded = (size_t)((bytes + 63) / 64 * 64);
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p != NULL) memset(p, 0, rounded ? rounded : 64);
    return p;
}

void tuner_model_free(tuner_model *m) {
    if (m == NULL) return;
    for (int i = 0; i < REGION_COUNT; i++) free(m->regions[i]);
    for (int64_t i = 0; m->inputs && i < m->ninputs; i++) free(m->inputs[i].name);
    for (int64_t i = 0; m->outputs && i < m->noutputs; i++) free(m->outputs[i].name);
    free(m->inputs);
    free(m->outputs);
    free(m->records);
    free(m->arg_storage);
    if (m->self != NULL) dlclose(m->self);
    free(m);
}

static int read_tensors(reader *r, tuner_model *m, tuner_tensor **out, int64_t *count) {
    *count = read_count(r, 1 << 16);
    *out = calloc((size_t)*count + 1, sizeof **out);
    if (*out == NULL) return TUNER_E_NOMEM;
    for (int64_t i = 0; i < *count && !r->failed; i++) {
        (*out)[i].name = read_name(r);
        (*out)[i].elements = read_count(r, INT64_MAX / 8);
        (*out)[i].offset = read_count(r, m->region_bytes[REGION_ARENA]);
        if (!r->failed && (*out)[i].elements * 4 > m->region_bytes[REGION_ARENA] - (*out)[i].offset)
            r->failed = 1;
    }
    return r->failed ? TUNER_E_FORMAT : TUNER_OK;
}

static int load_weights(const char *dir, tuner_model *m, uint64_t expected_hash) {
    unsigned char *data = NULL;
    size_t size = 0;
    int status = read_file(dir, "model.weights", &data, &size);
    if (status != TUNER_OK) {
        free(data);
        return status;
    }
    if (size < 16 || memcmp(data, "TUNERWGT", 8) != 0) {
        free(data);
        return TUNER_E_FORMAT;
    }
    reader r = {data, size, 8, 0};
    int64_t bytes = read_count(&r, (int64_t)size);
    if ((r.failed || size - r.at != (size_t)bytes)) status = TUNER_E_FORMAT;
    if (status == TUNER_OK && bytes != m->region_bytes[REGION_WEIGHTS]) status = TUNER_E_MISMATCH;
    if (status == TUNER_OK && checksum(data + r.at, (size_t)bytes) != expected_hash)
        status = TUNER_E_MISMATCH;
    if (status == TUNER_OK) memcpy(m->regions[REGION_WEIGHTS], data + r.at, (size_t)bytes);
    free(data);
    return status;
}

static void *resolve(tuner_model *m, int64_t region, int64_t offset) {
    if (region < 0 || region >= REGION_COUNT || offset < 0 || offset > m->region_bytes[region])
        return NULL;
    return (char *)m->regions[region] + offset;
}

static int read_records(reader *r, tuner_model *m, char **symbols, int64_t nsymbols) {
    m->nrecords = read_count(r, 1 << 20);
    int64_t total_args = read_count(r, (int64_t)1 << 24);
    m->records = calloc((size_t)m->nrecords + 1, sizeof *m->records);
    m->arg_storage = calloc((size_t)total_args + 1, sizeof *m->arg_storage);
    if (m->records == NULL || m->arg_storage == NULL) return TUNER_E_NOMEM;
    int64_t used = 0;
    for (int64_t i = 0; i < m->nrecords && !r->failed; i++) {
        tuner_record *rec = &m->records[i];
        rec->kind = read_i64(r);
        int64_t symbol = read_i64(r);
        rec->aux = read_i64(r);
        rec->argc = read_count(r, 1 << 16);
        if (r->failed) break;
        if (rec->argc > TUNER_MAX_ARGS) return TUNER_E_ARGS;
        if (used + rec->argc > total_args) return TUNER_E_FORMAT;
        rec->args = m->arg_storage + used;
        used += rec->argc;
        int64_t room = INT64_MAX; /* bytes left after the smallest remaining argument */
        for (int64_t k = 0; k < rec->argc; k++) {
            int64_t region = read_i64(r), offset = read_i64(r);
            rec->args[k] = resolve(m, region, offset);
            if (rec->args[k] == NULL) r->failed = 1;
            else if (m->region_bytes[region] - offset < room) room = m->region_bytes[region] - offset;
        }
        if (rec->kind == KIND_COPY && rec->aux > room) return TUNER_E_FORMAT;
        if (rec->kind == KIND_CALL) {
            if (symbol < 0 || symbol >= nsymbols) return TUNER_E_FORMAT;
            rec->function = dlsym(m->self, symbols[symbol]);
            if (rec->function == NULL) return TUNER_E_SYMBOL;
            rec->aux = m->nthreads;
        } else if (rec->kind != KIND_COPY || rec->argc != 2 || rec->aux < 0) {
            return TUNER_E_FORMAT;
        }
    }
    return r->failed ? TUNER_E_FORMAT : TUNER_OK;
}

static int parse_program(reader *r, const char *dir, tuner_model *m) {
    /* magic, version, ..., then the checksum of every byte before it */
    if (r->size < 24 || memcmp(r->data, "TUNERPRG", 8) != 0) return TUNER_E_FORMAT;
    uint64_t hash;
    memcpy(&hash, r->data + r->size - 8, sizeof hash);
    if (checksum(r->data, r->size - 8) != hash) return TUNER_E_FORMAT;
    r->size -= 8;
    r->at = 8;
    if (read_i64(r) != TUNER_PROGRAM_VERSION) return TUNER_E_FORMAT;
    m->nthreads = read_count(r, 1 << 16);
    for (int i = 0; i < REGION_COUNT; i++) m->region_bytes[i] = read_count(r, (int64_t)1 << 40);
    uint64_t weights_hash = (uint64_t)read_i64(r);
    if (r->failed) return TUNER_E_FORMAT;
    for (int i = 0; i < REGION_COUNT; i++)
        if ((m->regions[i] = zeroed(m->region_bytes[i])) == NULL) return TUNER_E_NOMEM;
    int status = load_weights(dir, m, weights_hash);
    if (status != TUNER_OK) return status;
    int64_t nsymbols = read_count(r, 1 << 16);
    char **symbols = calloc((size_t)nsymbols + 1, sizeof *symbols);
    if (symbols == NULL) return TUNER_E_NOMEM;
    for (int64_t i = 0; i < nsymbols && !r->failed; i++) symbols[i] = read_name(r);
    status = r->failed ? TUNER_E_FORMAT : read_tensors(r, m, &m->inputs, &m->ninputs);
    if (status == TUNER_OK) status = read_tensors(r, m, &m->outputs, &m->noutputs);
    if (status == TUNER_OK) status = read_records(r, m, symbols, nsymbols);
    for (int64_t i = 0; i < nsymbols; i++) free(symbols[i]);
    free(symbols);
    if (status == TUNER_OK && r->at != r->size) status = TUNER_E_FORMAT;
    return status;
}

int tuner_model_open(const char *dir, tuner_model **out) {
    if (dir == NULL || out == NULL) return TUNER_E_INVALID;
    *out = NULL;
    tuner_model *m = calloc(1, sizeof *m);
    if (m == NULL) return TUNER_E_NOMEM;
    Dl_info info;
    if (dladdr((void *)&tuner_model_open, &info) == 0 || info.dli_fname == NULL ||
        (m->self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) == NULL) {
        free(m);
        return TUNER_E_SYMBOL;
    }
    unsigned char *data = NULL;
    size_t size = 0;
    int status = read_file(dir, "model.program", &data, &size);
    if (status == TUNER_OK) {
        reader r = {data, size, 0, 0};
        status = parse_program(&r, dir, m);
    }
    free(data);
    if (status != TUNER_OK) {
        tuner_model_free(m);
        return status;
    }
    *out = m;
    return TUNER_OK;
}

tuner_model *tuner_model_load(const char *dir) {
    tuner_model *m = NULL;
    return tuner_model_open(dir, &m) == TUNER_OK ? m : NULL;
}

int tuner_model_run(tuner_model *m, const float *const *inputs, float *const *outputs) {
    if (m == NULL || inputs == NULL || outputs == NULL) return TUNER_E_INVALID;
    char *arena = m->regions[REGION_ARENA];
    for (int64_t i = 0; i < m->ninputs; i++) {
        if (inputs[i] == NULL) return TUNER_E_INVALID;
        memcpy(arena + m->inputs[i].offset, inputs[i], (size_t)m->inputs[i].elements * 4);
    }
    for (int64_t i = 0; i < m->noutputs; i++)
        if (outputs[i] == NULL) return TUNER_E_INVALID;
    int status = tuner_program_run(m->records, m->nrecords);
    if (status != TUNER_OK) return status;
    for (int64_t i = 0; i < m->noutputs; i++)
        memcpy(outputs[i], arena + m->outputs[i].offset, (size_t)m->outputs[i].elements * 4);
    return TUNER_OK;
}

int64_t tuner_model_num_inputs(const tuner_model *m) { return m ? m->ninputs : -1; }
int64_t tuner_model_num_outputs(const tuner_model *m) { return m ? m->noutputs : -1; }

const char *tuner_model_input_name(const tuner_model *m, int64_t i) {
    return m && i >= 0 && i < m->ninputs ? m->inputs[i].name : NULL;
}

const char *tuner_model_output_name(const tuner_model *m, int64_t i) {
    return m && i >= 0 && i < m->noutputs ? m->outputs[i].name : NULL;
}

int64_t tuner_model_input_size(const tuner_model *m, int64_t i) {
    return m && i >= 0 && i < m->ninputs ? m->inputs[i].elements : -1;
}

int64_t tuner_model_output_size(const tuner_model *m, int64_t i) {
    return m && i >= 0 && i < m->noutputs ? m->outputs[i].elements : -1;
}

int tuner_model_set_threads(tuner_model *m, int64_t nthreads) {
    if (m == NULL || nthreads < 1) return TUNER_E_INVALID;
    m->nthreads = nthreads;
    for (int64_t i = 0; i < m->nrecords; i++)
        if (m->records[i].kind == KIND_CALL) m->records[i].aux = nthreads;
    return TUNER_OK;
}
