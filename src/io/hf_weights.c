#include "io/hf_weights.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"

static int shard_index(const HfWeights *w, char **names, const char *file) {
    for (int i = 0; i < w->n_files; i++)
        if (strcmp(names[i], file) == 0) return i;
    return -1;
}

void hf_weights_open(HfWeights *w, const char *dir) {
    memset(w, 0, sizeof *w);
    char *single = path_join(dir, "model.safetensors"), *index = path_join(dir, "model.safetensors.index.json");
    if (!file_exists(index)) {
        if (!file_exists(single)) die("%s: no model.safetensors or model.safetensors.index.json", dir);
        w->files = xcalloc(1, sizeof(SafeTensors));
        safetensors_open(&w->files[0], single);
        w->n_files = 1;
        free(single);
        free(index);
        return;
    }
    cJSON *root = json_load_file(index, FILE_MAX_JSON);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) die("%s: missing object \"weight_map\"", index);
    int n_entries = cJSON_GetArraySize(map);
    char **names = xcalloc((size_t)n_entries, sizeof *names);
    w->files = xcalloc((size_t)n_entries, sizeof(SafeTensors));
    w->map_names = xcalloc((size_t)n_entries, sizeof *w->map_names);
    w->map_file = xcalloc((size_t)n_entries, sizeof *w->map_file);
    for (const cJSON *e = map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !e->valuestring[0] || strcmp(e->valuestring, ".") == 0 ||
            strcmp(e->valuestring, "..") == 0)
            die("%s: weight_map entry \"%s\" must be a file name in the model directory", index, e->string);
        int f = shard_index(w, names, e->valuestring);
        if (f < 0) {
            names[f = w->n_files] = e->valuestring;
            char *p = path_join(dir, e->valuestring);
            safetensors_open(&w->files[w->n_files++], p);
            free(p);
        }
        // The index is a promise about the shards: hold it to that.
        if (!safetensors_find(&w->files[f], e->string))
            die("%s: tensor \"%s\" is listed in the index but missing from the shard", w->files[f].path, e->string);
        w->map_names[w->n_map] = xstrdup(e->string);
        w->map_file[w->n_map++] = f;
    }
    free(names);
    cJSON_Delete(root);
    free(single);
    free(index);
}

void hf_weights_close(HfWeights *w) {
    for (int i = 0; i < w->n_files; i++) safetensors_close(&w->files[i]);
    for (int i = 0; i < w->n_map; i++) free(w->map_names[i]);
    free(w->map_names);
    free(w->map_file);
    free(w->files);
    memset(w, 0, sizeof *w);
}

const StTensor *hf_weights_find(const HfWeights *w, const char *name, const char **file) {
    int f = w->n_map ? -1 : 0;
    for (int i = 0; i < w->n_map && f < 0; i++)
        if (strcmp(w->map_names[i], name) == 0) f = w->map_file[i];
    if (f < 0) return NULL;
    if (file) *file = w->files[f].path;
    return safetensors_find(&w->files[f], name);
}
