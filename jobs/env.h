/*
 * env.h - the non-HTTP half of the core: the objects the work that
 * operations run needs (devices, memory, the catalog and its stager, the
 * operations registry, saved shardings, the model registry) and the
 * limits imports read (the largest safetensors header one may hold, and
 * the budget all the headers being read share).
 *
 * The server makes one at start (inside struct ts_core, handlers/api.h);
 * tests make their own on the sim backend. Every job (jobs/) takes one and
 * nothing else of the server, so a job runs the same under HTTP and under a
 * unit test.
 *
 * Thread-safety: immutable after start; the objects it points to are
 * thread-safe.
 */
#ifndef TS_JOBS_ENV_H
#define TS_JOBS_ENV_H

#include <stdatomic.h>
#include <stdint.h>

struct ts_device_set;
struct ts_memory;
struct ts_catalog;
struct ts_stager;
struct ts_op_registry;
struct ts_sharding_registry;
struct ts_model_registry;

struct ts_jobs_env {
	struct ts_device_set *devices;
	struct ts_memory *memory;
	struct ts_catalog *catalog;
	struct ts_stager *stager;
	struct ts_op_registry *operations;        /* long-running operations (ops/operation.h) */
	struct ts_sharding_registry *shardings;   /* saved shardings (storage/sharding.h) */
	struct ts_model_registry *models;         /* training models (train/model.h) */
	uint64_t import_header_max;               /* largest safetensors header an import
	                                           * holds; 0: no limit */
	uint64_t import_header_budget;            /* all headers being read together; 0: none */
	_Atomic uint64_t *import_header_used;     /* bytes of that budget held now */
};

#endif
