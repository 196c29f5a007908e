#include "train/optim.h"

#include <math.h>
#include <string.h>

int lr_schedule_parse(const char *s, LrSchedule *out) {
    static const char *names[] = {"constant", "linear", "cosine"};
    for (int i = 0; i < 3; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (LrSchedule)i;
            return 1;
        }
    return 0;
}

double lr_at(LrSchedule s, double base_lr, int64_t warmup, int64_t total, int64_t step) {
    if (step < warmup) return base_lr * (double)step / (double)(warmup > 1 ? warmup : 1);
    double span = (double)(total - warmup > 1 ? total - warmup : 1);
    switch (s) {
    case LR_LINEAR: return base_lr * fmax(0.0, (double)(total - step) / span);
    case LR_COSINE: return base_lr * fmax(0.0, 0.5 * (1.0 + cos(3.14159265358979323846 * (double)(step - warmup) / span)));
    default: return base_lr;
    }
}

void loss_scaler_update(LossScaler *s, int overflow) {
    if (s->window == 0) return;
    if (overflow) {
        s->scale /= 2.0;
        s->good = 0;
    } else if (++s->good == s->window) {
        s->scale *= 2.0;
        s->good = 0;
    }
}

