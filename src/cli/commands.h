// One entry point per subcommand; each parses its own options (argv[0] is the command name).
#pragma once

int cmd_init(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_render(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_sft(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_serve(int argc, char **argv);
