set terminal pngcairo size 1000,600
set output 'docs/perf/softmax.png'
set title 'sdpa softmax: throughput against size (higher is better)'
set logscale x 2
set format x '2^{%L}'
set xlabel 'n (floats)'
set ylabel 'G elements/s'
set key outside right
set grid
plot 'docs/perf/softmax.dat' index 0 with linespoints title 'avx512 fast', 'docs/perf/softmax.dat' index 1 with linespoints title 'avx512 sleef', 'docs/perf/softmax.dat' index 2 with linespoints title 'avx2 fast', 'docs/perf/softmax.dat' index 3 with linespoints title 'avx2 sleef', 'docs/perf/softmax.dat' index 4 with linespoints title 'sse fast', 'docs/perf/softmax.dat' index 5 with linespoints title 'sse sleef', 'docs/perf/softmax.dat' index 6 with linespoints title 'scalar fast', 'docs/perf/softmax.dat' index 7 with linespoints title 'scalar sleef', 'docs/perf/softmax.dat' index 8 with linespoints title 'onednn', 'docs/perf/softmax.dat' index 9 with linespoints title 'naive'
