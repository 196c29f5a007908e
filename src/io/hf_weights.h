// The weights of a Hugging Face model directory: one model.safetensors, or shards listed in
// model.safetensors.index.json ({"weight_map": {tensor name: shard file}}).
#pragma once
#include "io/safetensors.h"

typedef struct {
    int n_files;
    SafeTensors *files;
    // The index's weight_map (empty for a single file): a shard may hold stale extra copies,
    // so names resolve through the map, as in Hugging Face.
    int n_map;
    char **map_names;
    int *map_file;
} HfWeights;

void hf_weights_open(HfWeights *w, const char *dir);
void hf_weights_close(HfWeights *w);
// The tensor and the file holding it, or NULL when no file has it.
const StTensor *hf_weights_find(const HfWeights *w, const char *name, const char **file);
