set terminal pngcairo size 900,500
set output 'loss.png'
set title 'GPT-2 (4 layers, C=128) on 2 stages: f32 vs bf16 stage boundaries'
set xlabel 'step'
set ylabel 'training loss (nats/token)'
set y2label 'relative difference'
set y2tics
set logscale y2
plot 'loss.dat' u 1:2 w l lw 2 t 'f32 boundaries', 'loss.dat' u 1:3 w l lw 2 dt 2 t 'bf16 boundaries', 'loss.dat' u 1:($4>0?$4:1e-12) axes x1y2 w l lc rgb 'gray' t '|bf16 - f32| / f32'
