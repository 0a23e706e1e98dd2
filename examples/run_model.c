/* Run a model built by `tuner build --standalone` without Python.
 *
 *   run_model LIB_DIR [-i INPUTS.bin] [-o OUTPUTS.bin] [-n RUNS]
 *
 * Opens LIB_DIR/libmodel.so with dlopen, loads LIB_DIR/model.program and model.weights with
 * tuner_model_open, and runs the model RUNS times (default 10). Inputs: the raw fp32 values of
 * every input, in the model's input order, concatenated (INPUTS.bin), or a fixed pattern when
 * no file is given. Outputs are written the same way to OUTPUTS.bin (default outputs.bin).
 * Prints each tensor's name and size, and the median and best run time.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct tuner_model tuner_model;

struct api {
    int (*open)(const char *, tuner_model **);
    int (*run)(tuner_model *, const float *const *, float *const *);
    void (*free)(tuner_model *);
    const char *(*strerror)(int);
    int64_t (*num_inputs)(const tuner_model *), (*num_outputs)(const tuner_model *);
    const char *(*input_name)(const tuner_model *, int64_t);
    const char *(*output_name)(const tuner_model *, int64_t);
    int64_t (*input_size)(const tuner_model *, int64_t), (*output_size)(const tuner_model *, int64_t);
};

static int bind(void *lib, struct api *api) {
    void **slots[] = {(void **)&api->open, (void **)&api->run, (void **)&api->free,
                      (void **)&api->strerror, (void **)&api->num_inputs,
                      (void **)&api->num_outputs, (void **)&api->input_name,
                      (void **)&api->output_name, (void **)&api->input_size,
                      (void **)&api->output_size};
    const char *names[] = {"tuner_model_open", "tuner_model_run", "tuner_model_free",
                           "tuner_strerror", "tuner_model_num_inputs", "tuner_model_num_outputs",
                           "tuner_model_input_name", "tuner_model_output_name",
                           "tuner_model_input_size", "tuner_model_output_size"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        *slots[i] = dlsym(lib, names[i]);
        if (*slots[i] == NULL) {
            fprintf(stderr, "error: the library has no %s (rebuild it)\n", names[i]);
            return 1;
        }
    }
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Fill the inputs from `path` (all values, in order) or with a fixed pattern. */
static int read_inputs(const char *path, float **inputs, const int64_t *sizes, int64_t count) {
    if (path == NULL) {
        for (int64_t k = 0; k < count; k++)
            for (int64_t i = 0; i < sizes[k]; i++)
                inputs[k][i] = (float)((i * 7919 + k * 104729) % 2001) / 1000.0f - 1.0f;
        return 0;
    }
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "error: cannot open %s\n", path);
        return 1;
    }
    for (int64_t k = 0; k < count; k++) {
        if (fread(inputs[k], sizeof(float), (size_t)sizes[k], f) != (size_t)sizes[k]) {
            fprintf(stderr, "error: %s is shorter than the model's inputs\n", path);
            fclose(f);
            return 1;
        }
    }
    fclose(f);
    return 0;
}

static int write_outputs(const char *path, float **outputs, const int64_t *sizes, int64_t count) {
    FILE *f = fopen(path, "wb");
    int failed = f == NULL;
    for (int64_t k = 0; !failed && k < count; k++)
        failed = fwrite(outputs[k], sizeof(float), (size_t)sizes[k], f) != (size_t)sizes[k];
    if (f != NULL && fclose(f) != 0) failed = 1;
    if (failed) fprintf(stderr, "error: cannot write %s\n", path);
    return failed;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *in_path = NULL, *out_path = "outputs.bin";
    int runs = 10;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-i") == 0 && i + 1 < argc) in_path = argv[++i];
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) out_path = argv[++i];
        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) runs = atoi(argv[++i]);
        else if (dir == NULL && argv[i][0] != '-') dir = argv[i];
        else dir = NULL, i = argc;
    }
    if (dir == NULL || runs < 1) {
        fprintf(stderr, "usage: %s LIB_DIR [-i INPUTS.bin] [-o OUTPUTS.bin] [-n RUNS]\n", argv[0]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/libmodel.so", dir);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    struct api api;
    if (lib == NULL) {
        fprintf(stderr, "error: %s\n", dlerror());
        return 1;
    }
    if (bind(lib, &api) != 0) return 1;
    tuner_model *model = NULL;
    int status = api.open(dir, &model);
    if (status != 0) {
        fprintf(stderr, "error: cannot load the model in %s: %s (code %d)\n", dir,
                api.strerror(status), status);
        return 1;
    }
    int64_t n_in = api.num_inputs(model), n_out = api.num_outputs(model);
    float **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
    float **outputs = calloc((size_t)n_out + 1, sizeof *outputs);
    int64_t *in_sizes = calloc((size_t)n_in + 1, sizeof *in_sizes);
    int64_t *out_sizes = calloc((size_t)n_out + 1, sizeof *out_sizes);
    double *times = calloc((size_t)runs, sizeof *times);
    for (int64_t k = 0; k < n_in; k++) {
        in_sizes[k] = api.input_size(model, k);
        inputs[k] = malloc((size_t)in_sizes[k] * sizeof(float));
        printf("input  %s: %lld floats\n", api.input_name(model, k), (long long)in_sizes[k]);
    }
    for (int64_t k = 0; k < n_out; k++) {
        out_sizes[k] = api.output_size(model, k);
        outputs[k] = malloc((size_t)out_sizes[k] * sizeof(float));
        printf("output %s: %lld floats\n", api.output_name(model, k), (long long)out_sizes[k]);
    }
    int failed = read_inputs(in_path, inputs, in_sizes, n_in);
    for (int r = 0; !failed && r < runs; r++) {
        double start = now();
        status = api.run(model, (const float *const *)inputs, outputs);
        times[r] = now() - start;
        if (status != 0) {
            fprintf(stderr, "error: run failed: %s (code %d)\n", api.strerror(status), status);
            failed = 1;
        }
    }
    if (!failed) failed = write_outputs(out_path, outputs, out_sizes, n_out);
    if (!failed) {
        qsort(times, (size_t)runs, sizeof *times, compare);
        printf("%d runs: median %.3f ms, best %.3f ms; outputs in %s\n", runs,
               1e3 * times[runs / 2], 1e3 * times[0], out_path);
    }
    for (int64_t k = 0; k < n_in; k++) free(inputs[k]);
    for (int64_t k = 0; k < n_out; k++) free(outputs[k]);
    free(inputs), free(outputs), free(in_sizes), free(out_sizes), free(times);
    api.free(model);
    dlclose(lib);
    return failed;
}
