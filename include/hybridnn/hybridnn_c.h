/* hybridnn's C ABI: the stable interface of libhybridnn.
 *
 * Everything a program (C, C++ through hybridnn.hpp, Python, another framework) needs:
 * drivers, tensors over its own or the library's memory, a layer run as a kernel on its
 * buffers, nets from Caffe prototxt and .caffemodel files, the solver, the hybrid split and
 * the collectives between ranks. No C++ type, enum layout or exception crosses it.
 *
 * Conventions
 *  - Objects are opaque handles made by hn_*_create (or returned by a call that says so)
 *    and released by the matching hn_*_destroy, which accepts NULL. Every handle a call
 *    gives out is the caller's to destroy, and holds what it needs alive: a tensor of a
 *    net's blob keeps the net, a driver keeps its runtime. Destroying in any order is safe.
 *  - Every call that can fail returns an hn_status: HN_OK (0) or an error code. The error's
 *    message (naming the file, line, layer, shape or rank at fault) stays readable through
 *    hn_last_error() on the calling thread until that thread's next failing call.
 *  - Strings are UTF-8, NUL-terminated. A `const char*` a call returns stays valid while
 *    the handle it came from lives, until the next call on that handle that returns one.
 *  - Sizes of tensors are int64_t; the batch is axis 0; data is float32, C order (NCHW).
 *  - Calls on one handle are not synchronised: use a handle from one thread at a time.
 *    Different handles may be used from different threads.
 *
 * How the ABI grows (HN_ABI_VERSION)
 *  - Functions are only ever added, never removed, and an existing function's parameters
 *    and meaning do not change. A change that needs other parameters is a new function
 *    with a new name (hn_net_forward2), the old one kept.
 *  - No struct crosses the ABI: options are key/value strings (hn_*_options_set), so a
 *    new option is a new key, never a new field.
 *  - Status codes and enum-like constants are plain integers; new ones are added with new
 *    values. Treat an unknown status as an error.
 *  - HN_ABI_VERSION counts these additions. hn_abi_version() returns the library's; a
 *    program built against version N runs with any library whose hn_abi_version() >= N
 *    and whose major version (hn_version()) is the same.
 */
#ifndef HYBRIDNN_C_H
#define HYBRIDNN_C_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define HN_API __attribute__((visibility("default")))
#else
#define HN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define HN_ABI_VERSION 2

/* ---- status and errors ------------------------------------------------------------- */

typedef int32_t hn_status;
#define HN_OK 0
#define HN_ERROR 1                  /* the library refused or failed (hn_last_error says why) */
#define HN_ERROR_INVALID_ARGUMENT 2 /* a NULL handle, a bad count, an unknown option */
#define HN_ERROR_OUT_OF_MEMORY 3
#define HN_ERROR_NOT_FOUND 4 /* a blob, layer, file or device that does not exist */
#define HN_ERROR_TIMEOUT 5   /* a collective whose ranks did not all arrive in time */
#define HN_ERROR_CAPACITY 6  /* the caller's array is too small (nothing was written to it) */

/* The message of the calling thread's last failed call ("" when none failed yet). */
HN_API const char* hn_last_error(void);
/* "ok", "error", "invalid argument", ... */
HN_API const char* hn_status_name(hn_status status);
/* The library's version, "MAJOR.MINOR.PATCH", and its ABI version (HN_ABI_VERSION). */
HN_API const char* hn_version(void);
HN_API int32_t hn_abi_version(void);
/* Host memory: the most one allocation of the library may ask for (by default physical
 * memory plus swap, or the environment's HYBRIDNN_MEMORY_LIMIT), checked before allocating,
 * so that a net too large fails naming its layer and blob; setting 0 restores the default.
 * And the process's peak resident memory so far, in bytes (0 where the system does not say). */
HN_API uint64_t hn_host_memory_limit(void);
HN_API void hn_set_host_memory_limit(uint64_t bytes);
HN_API uint64_t hn_peak_resident_bytes(void);

/* ---- handles ----------------------------------------------------------------------- */

typedef struct hn_runtime hn_runtime;
typedef struct hn_driver hn_driver;
typedef struct hn_tensor hn_tensor;
typedef struct hn_layer hn_layer;
typedef struct hn_net hn_net;
typedef struct hn_net_options hn_net_options;
typedef struct hn_solver hn_solver;
typedef struct hn_solver_options hn_solver_options;
typedef struct hn_solver_event hn_solver_event;
typedef struct hn_comm hn_comm;

/* ---- runtime and drivers ------------------------------------------------------------- */

/* A runtime holds the drivers a program computes with ("cpu", "reference", "cuda:N"). */
HN_API hn_status hn_runtime_create(hn_runtime** out);
HN_API void hn_runtime_destroy(hn_runtime* runtime);
/* Adds the driver of `device` and returns a handle to it. `options` is NULL or
 * "key=value,key=value" with the driver's options (cpu: threads=N, blas=onednn|openblas,
 * cores=0-5: the cores its threads run on, one core or range here, as commas part options).
 * Adding a device twice returns the driver already there. */
HN_API hn_status hn_runtime_add_driver(hn_runtime* runtime, const char* device, const char* options,
                                       hn_driver** out);
/* The devices usable on this machine and build, comma-separated ("reference,cpu,cuda:0"). */
HN_API hn_status hn_available_devices(const char** out);
HN_API void hn_driver_destroy(hn_driver* driver);
/* The device's canonical name ("cpu", "cuda:0") and a description of the hardware. */
HN_API const char* hn_driver_name(const hn_driver* driver);
HN_API const char* hn_driver_description(const hn_driver* driver);

/* ---- tensors ----------------------------------------------------------------------- */

#define HN_MAX_AXES 8

/* How a call uses a tensor's memory it hands out. */
#define HN_READ 0      /* read only */
#define HN_WRITE 1     /* read and write */
#define HN_OVERWRITE 2 /* every element will be written: the old values are not fetched */

/* A tensor of the library's memory (data and gradient, zero-filled), current wherever it
 * was last written (host or a device); hn_tensor_data / hn_tensor_diff bring it to the host. */
HN_API hn_status hn_tensor_create(int32_t axes, const int64_t* dims, hn_tensor** out);
/* A tensor over the caller's memory, used in place and never copied or freed: `data` (and
 * `diff`, may be NULL: then the library's) hold count floats each, in the memory of
 * `driver` (NULL: host memory; a cuda:N driver: that GPU's). The memory must outlive the
 * handle. Calls that compute on the tensor take the caller's values as they are at the
 * call and leave their results in the caller's arrays when they return. */
HN_API hn_status hn_tensor_wrap(int32_t axes, const int64_t* dims, float* data, float* diff,
                                hn_driver* driver, hn_tensor** out);
HN_API void hn_tensor_destroy(hn_tensor* tensor);
HN_API int32_t hn_tensor_axes(const hn_tensor* tensor);
/* Copies the tensor's dimensions into `dims`, an array of `capacity` entries:
 * HN_ERROR_CAPACITY, writing nothing, when it has fewer than hn_tensor_axes(). */
HN_API hn_status hn_tensor_dims(const hn_tensor* tensor, int64_t* dims, int32_t capacity);
HN_API int64_t hn_tensor_count(const hn_tensor* tensor);
/* Host pointers to the data or the gradient for `access` (HN_READ, HN_WRITE,
 * HN_OVERWRITE), valid until the tensor is next used by the library (a layer, net or
 * solver call) or destroyed. For wrapped tensors: the caller's pointers (host memory
 * only). A net's tensor without a gradient (no backward) has none: HN_ERROR. */
HN_API hn_status hn_tensor_data(hn_tensor* tensor, int32_t access, float** out);
HN_API hn_status hn_tensor_diff(hn_tensor* tensor, int32_t access, float** out);
/* Whether the tensor's memory is in a blocked layout, nChw16c or nChw8c (a net's inner
 * blobs with the net option layout=blocked): hn_tensor_data and hn_tensor_diff refuse
 * those (keep_blobs keeps a blob NCHW). */
HN_API int32_t hn_tensor_is_blocked(const hn_tensor* tensor);

/* ---- a layer as a kernel ------------------------------------------------------------ */

/* A layer from one Caffe LayerParameter in prototxt text, e.g.
 *   name: "conv1" type: "Convolution"
 *   convolution_param { num_output: 16 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } }
 * Its parameters (weights, bias) are the layer's own tensors, filled by its fillers at setup,
 * unless replaced by hn_layer_set_param. Phase "train" unless set (hn_layer_set_phase). */
HN_API hn_status hn_layer_create(const char* layer_prototxt, hn_layer** out);
HN_API void hn_layer_destroy(hn_layer* layer);
HN_API const char* hn_layer_type(const hn_layer* layer);
#define HN_PHASE_TRAIN 0
#define HN_PHASE_TEST 1
HN_API hn_status hn_layer_set_phase(hn_layer* layer, int32_t phase);
/* Shapes the layer for inputs of these shapes (the tensors' shapes; their memory is not
 * used) and reports how many outputs it has. Called again when the input shapes change. */
HN_API hn_status hn_layer_setup(hn_layer* layer, int32_t num_inputs, hn_tensor* const* inputs,
                                int32_t* num_outputs);
/* Output `output`'s number of axes into *axes and its dimensions into `dims`, an array of
 * `capacity` entries: HN_ERROR_CAPACITY, with *axes set and nothing written to dims, when
 * it is too small (dims NULL with capacity 0 asks for *axes only). An output may have more
 * than HN_MAX_AXES axes (a Reshape's). */
HN_API hn_status hn_layer_output_shape(const hn_layer* layer, int32_t output, int32_t* axes,
                                       int64_t* dims, int32_t capacity);
/* hn_layer_output_shape with capacity HN_MAX_AXES (dims holds HN_MAX_AXES entries). */
HN_API hn_status hn_layer_output_dims(const hn_layer* layer, int32_t output, int32_t* axes,
                                      int64_t* dims /* HN_MAX_AXES */);
/* The layer's parameters (weights, bias): count, and a tensor handle of parameter i (the
 * layer's own, or the one set). */
HN_API int32_t hn_layer_num_params(const hn_layer* layer);
HN_API hn_status hn_layer_param(hn_layer* layer, int32_t index, hn_tensor** out);
/* Makes the layer compute with `param` as its parameter `index` (same shape): the caller's
 * weights, and gradients added into the caller's diff. */
HN_API hn_status hn_layer_set_param(hn_layer* layer, int32_t index, hn_tensor* param);
/* Cuts the layer's batch among the drivers of `runtime` ("cpu:0.5,cuda:0:0.5"; NULL or ""
 * for none: the whole batch on the driver of each call), merged exactly as in a net. */
HN_API hn_status hn_layer_set_split(hn_layer* layer, hn_runtime* runtime, const char* split);
/* Forward on `driver` over the whole batch: reads inputs' data, writes outputs' data. The
 * tensors must have the shapes of the last setup and be in memory the driver reaches. */
HN_API hn_status hn_layer_forward(hn_layer* layer, hn_driver* driver, hn_tensor* const* inputs,
                                  hn_tensor* const* outputs);
/* Backward after a forward on the same tensors: reads outputs' diff, overwrites the diff of
 * each input i with propagate_down[i] != 0 (NULL: every input that can take one), and ADDS
 * the parameter gradients into the parameters' diff (as Caffe; clear them yourself). */
HN_API hn_status hn_layer_backward(hn_layer* layer, hn_driver* driver, hn_tensor* const* inputs,
                                   hn_tensor* const* outputs, const int32_t* propagate_down);

/* ---- nets ---------------------------------------------------------------------------- */

/* Options of a net, as key=value strings (hn_net_options_set lists the keys it knows in its
 * error when given another):
 *   phase          train (default) | test
 *   level, stage   Caffe's NetState (stage: comma-separated)
 *   batch          batch size of the Data and Input layers (default: the prototxt's)
 *   data           source of every Data layer (LMDB dir, IDX or CIFAR-10 file,
 *                  synthetic:CxHxW[:classes])
 *   mean_file      replaces transform_param.mean_file (none: drop it)
 *   force_backward on | off (default off): gradients for every blob, inputs included
 *   reuse_memory   on (default) | off
 *   keep_blobs     comma-separated blobs whose memory is never reused
 *   seed           the net's random seed
 *   split          DEVICE:FRACTION,... or auto[:DEVICE,...] (the hybrid split; a bare
 *                  auto measures every available device but the reference driver)
 *   split_file     per-layer splits saved by the tool's --split-save
 *   model_parallel comma-separated layers cut across the ranks by their outputs
 *   tune           off | once | cached (default off)
 *   tune_cache     file of the measured choices
 *   layout         nchw (default) | blocked (nChw16c/8c between CPU layers)
 *   fuse           on (default) | off
 *   math           FP32 | TF32 | BF16: how GEMMs and convolutions may round inside a call
 *                  (default: the prototxt's `math`, else FP32; tensors stay FP32)
 *   weights        a .caffemodel to copy weights from (comma-separated: several)
 */
HN_API hn_status hn_net_options_create(hn_net_options** out);
HN_API void hn_net_options_destroy(hn_net_options* options);
HN_API hn_status hn_net_options_set(hn_net_options* options, const char* key, const char* value);

/* A net from a prototxt file, or from prototxt text (`origin` names it in errors), on
 * `driver`; options may be NULL. */
HN_API hn_status hn_net_create(hn_runtime* runtime, hn_driver* driver, const char* prototxt_path,
                               const hn_net_options* options, hn_net** out);
HN_API hn_status hn_net_create_from_text(hn_runtime* runtime, hn_driver* driver,
                                         const char* prototxt_text, const char* origin,
                                         const hn_net_options* options, hn_net** out);
HN_API void hn_net_destroy(hn_net* net);
HN_API const char* hn_net_name(const hn_net* net);
/* Forward through every layer (data layers fetch their next batch); `loss` (may be NULL)
 * gets the weighted sum of the loss outputs. */
HN_API hn_status hn_net_forward(hn_net* net, float* loss);
/* Backward through every layer that needs it, adding into the parameters' gradients. */
HN_API hn_status hn_net_backward(hn_net* net);
HN_API hn_status hn_net_clear_param_diffs(hn_net* net);
/* Weights in and out: from one or more .caffemodel files ("a,b"), to a .caffemodel. */
HN_API hn_status hn_net_copy_from(hn_net* net, const char* caffemodel_paths);
HN_API hn_status hn_net_save(hn_net* net, const char* caffemodel_path);
/* The net and its weights as an ONNX model (opset 13, the inference graph: losses and
 * accuracies left out; docs/onnx.md). A layer with no ONNX equivalent fails the call,
 * naming it, and nothing is written. Since ABI version 2. */
HN_API hn_status hn_net_save_onnx(hn_net* net, const char* onnx_path);
/* Layers: count, name, Caffe type, and the split it runs with ("" when unsplit). */
HN_API int32_t hn_net_num_layers(const hn_net* net);
HN_API const char* hn_net_layer_name(const hn_net* net, int32_t index);
HN_API const char* hn_net_layer_type(const hn_net* net, int32_t index);
HN_API const char* hn_net_layer_split(hn_net* net, int32_t index);
/* Blobs: all names, the inputs (Input layers' tops) and the outputs (unconsumed blobs),
 * comma-separated; a blob as a tensor (data and gradient, keeps the net alive). */
HN_API const char* hn_net_blob_names(hn_net* net);
HN_API const char* hn_net_input_names(hn_net* net);
HN_API const char* hn_net_output_names(hn_net* net);
HN_API hn_status hn_net_blob(hn_net* net, const char* name, hn_tensor** out);
/* Learnable parameters in Caffe's order: count, name ("conv1.0" unless named) and tensor. */
HN_API int32_t hn_net_num_params(const hn_net* net);
HN_API const char* hn_net_param_name(const hn_net* net, int32_t index);
HN_API hn_status hn_net_param(hn_net* net, int32_t index, hn_tensor** out);
/* Measures the automatic splits now (split=auto; the first forward does it otherwise). */
HN_API hn_status hn_net_calibrate_splits(hn_net* net);

/* ---- solver -------------------------------------------------------------------------- */

/* Options of a solver, as key=value strings:
 *   data                   source of every Data layer of the training and test nets
 *   train_data, test_data  sources of the training and test nets' Data layers (over data)
 *   mean_file              as the net option
 *   snapshot_prefix        replaces the solver's
 *   max_iter               replaces the solver's
 *   seed                   the random seed
 *   split, split_file      the hybrid split of the training and test nets
 *   model_parallel         as the net option
 *   tune, tune_cache, layout, fuse, math   as the net options
 *   bucket_mb              gradient bucket size for the allreduce in MiB (default 25)
 *   bucket_bytes           the same in bytes
 *   grad_compress          none (default) or bf16: gradients sent as BF16 with FP32 sums at
 *                          every hop (the ring and hier backends; others send FP32)
 *   graphs                 on (default) or off: on a GPU alone, the iterations after the
 *                          first replay one recorded forward and backward (a CUDA graph)
 * and a communicator (hn_solver_options_set_communicator) for data parallelism. */
HN_API hn_status hn_solver_options_create(hn_solver_options** out);
HN_API void hn_solver_options_destroy(hn_solver_options* options);
HN_API hn_status hn_solver_options_set(hn_solver_options* options, const char* key,
                                       const char* value);
HN_API hn_status hn_solver_options_set_communicator(hn_solver_options* options, hn_comm* comm);

/* A solver from a SolverParameter prototxt file, its nets on `driver`; options may be NULL. */
HN_API hn_status hn_solver_create(hn_runtime* runtime, hn_driver* driver,
                                  const char* solver_prototxt_path,
                                  const hn_solver_options* options, hn_solver** out);
HN_API void hn_solver_destroy(hn_solver* solver);
/* Trains until max_iter with tests and snapshots as configured (solve), or `iterations`
 * iterations (step). */
HN_API hn_status hn_solver_solve(hn_solver* solver);
HN_API hn_status hn_solver_step(hn_solver* solver, int32_t iterations);
/* Asks solve / step to stop after the current iteration (async-signal-safe). */
HN_API void hn_solver_request_stop(hn_solver* solver);
/* Writes a snapshot; `path` (may be NULL) gets the .caffemodel's path. */
HN_API hn_status hn_solver_snapshot(hn_solver* solver, const char** path);
HN_API hn_status hn_solver_restore(hn_solver* solver, const char* solverstate_path);
HN_API hn_status hn_solver_copy_weights(hn_solver* solver, const char* caffemodel_paths);
HN_API int32_t hn_solver_iter(const hn_solver* solver);
HN_API float hn_solver_loss(const hn_solver* solver); /* last iteration's */
HN_API float hn_solver_learning_rate(const hn_solver* solver);
/* The training net (keeps the solver alive), and the test nets. */
HN_API hn_status hn_solver_net(hn_solver* solver, hn_net** out);
HN_API int32_t hn_solver_num_test_nets(const hn_solver* solver);
HN_API hn_status hn_solver_test_net(hn_solver* solver, int32_t index, hn_net** out);
/* Runs test net `index` (test_iter batches); then hn_solver_result gives each output's mean. */
HN_API hn_status hn_solver_test(hn_solver* solver, int32_t index, int32_t* num_results);
HN_API hn_status hn_solver_result(const hn_solver* solver, int32_t index, const char** name,
                                  float* value);
/* Display, test and snapshot events, on the training thread, as they happen. The event
 * lives only during the call; read it with the functions below. */
#define HN_EVENT_TRAIN 0
#define HN_EVENT_TEST 1
#define HN_EVENT_SNAPSHOT 2
typedef void (*hn_solver_callback)(const hn_solver_event* event, void* user_data);
HN_API hn_status hn_solver_on_event(hn_solver* solver, hn_solver_callback callback,
                                    void* user_data);
HN_API int32_t hn_event_kind(const hn_solver_event* event);
HN_API int32_t hn_event_iter(const hn_solver_event* event);
HN_API int32_t hn_event_test_net(const hn_solver_event* event);
HN_API float hn_event_loss(const hn_solver_event* event);
HN_API float hn_event_learning_rate(const hn_solver_event* event);
HN_API double hn_event_images_per_second(const hn_solver_event* event);
/* The event's outputs (test: means over test_iter): count, then name and value of each. */
HN_API int32_t hn_event_num_outputs(const hn_solver_event* event);
HN_API const char* hn_event_output(const hn_solver_event* event, int32_t index, float* value);
/* The snapshot's .caffemodel path ("" for other events). */
HN_API const char* hn_event_snapshot(const hn_solver_event* event);

/* ---- collectives between ranks -------------------------------------------------------- */

/* The ranks mpirun started (backend "auto", "ring", "hier" or "mpi"), or this process alone
 * ("local"); NULL: the default ("auto" under a launcher with several ranks: "hier" where
 * the nodes hold several ranks each, numbered node by node (on one node, at least 3), else
 * "ring"; "local" without a launcher). Every
 * collective waits at most `timeout_seconds` (<= 0: 300) for the other ranks, then fails
 * with HN_ERROR_TIMEOUT naming the rank. */
HN_API hn_status hn_comm_create(const char* backend, double timeout_seconds, hn_comm** out);
HN_API void hn_comm_destroy(hn_comm* comm);
HN_API int32_t hn_comm_rank(const hn_comm* comm);
HN_API int32_t hn_comm_size(const hn_comm* comm);
HN_API const char* hn_comm_backend(const hn_comm* comm);
/* In place on `count` floats of `driver`'s memory (host memory for cpu): the sum over the
 * ranks (average != 0: the mean); every rank gets the same bits. */
HN_API hn_status hn_comm_allreduce(hn_comm* comm, hn_driver* driver, float* data, size_t count,
                                   int32_t average);
HN_API hn_status hn_comm_broadcast(hn_comm* comm, hn_driver* driver, float* data, size_t count,
                                   int32_t root);
HN_API hn_status hn_comm_barrier(hn_comm* comm);

/* ---- the tool ------------------------------------------------------------------------ */

/* The hybridnn tool's commands (train, test, time, device_query, convert, help), as the
 * `hybridnn` executable runs them: argv[0] is the program's name, argv[1] the command, then
 * its flags (`hn_tool_main` with "help" lists them). Prints to stdout and stderr and returns
 * the exit status: 0, 1 for an error (printed), 2 for a usage error (printed with the
 * command's usage). `train` turns SIGINT and SIGTERM into a snapshot and a stop while it
 * runs, and puts the caller's handlers back after. Under mpirun a failing rank returns 1 and
 * the others fail at their collectives' deadline (the executable ends them at once). */
HN_API int hn_tool_main(int argc, const char* const* argv);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* HYBRIDNN_C_H */
